"""Freeze, EMA, WeightMonitor and GradientNormMonitor on MaxText (``recipes/maxtext_tiny.py
--init-from`` a tiny Hugging Face Llama, scanned layers, Hugging Face names), the same
callbacks the other backends' tests run: frozen layers of the stacked arrays bitwise
unchanged until the step, then trained; the average as the test computes it from each
step's weights; a run resumed inside the frozen window freezes again and ends with the
same weights and averages bit for bit. Two MaxText runs (one resumed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("maxtext")

from baton.callbacks import EMA, Freeze, GradientNormMonitor, WeightMonitor
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.tiny_llama import load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
FROZEN = ["model.embed_tokens.*", "model.layers.0.*"]
DECAY = 0.5


class Weights(Callback):
    """Every parameter on the host after each step (and at the start), and the logs."""

    def __init__(self) -> None:
        self.after: dict[int, dict[str, np.ndarray]] = {}
        self.logs: dict[int, dict[str, float]] = {}
        self.averages: dict[str, np.ndarray] = {}

    def on_train_start(self, driver: Any) -> None:
        self.after[driver.step] = self.copy(driver)

    def on_step_end(self, driver: Any, output: Any) -> None:
        self.after[driver.step] = self.copy(driver)

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.logs[driver.step] = dict(metrics)

    def on_train_end(self, driver: Any) -> None:
        ema = next(c for c in driver.callbacks if isinstance(c, EMA))
        self.averages = {name: np.array(value) for name, value in ema.averages.items()}

    @staticmethod
    def copy(driver: Any) -> dict[str, np.ndarray]:
        return {p.name: np.array(p.value) for p in driver.backend.model_state().parameters()}


class StopAt(Callback):
    """Stop after a step (the run's settings, its schedule included, unchanged)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.step:
            driver.control.request_stop("stopped by the test", all_ranks=True)


def _run(hf_dir: Path, run_dir: Path, *extra: str, stop_at: int | None = None) -> Weights:
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "4", "--log-every", "1",
        "--save-every", "2", "--no-async-save", "--eval-every", "0",
        "--batch-size", "2", "--run-dir", str(run_dir), "--no-progress",
        "--overrides", "dtype=float32", *extra,
    ])  # fmt: skip
    weights = Weights()
    driver.callbacks += [Freeze(FROZEN, until_step=3), EMA(decay=DECAY), WeightMonitor(depth=3),
                         GradientNormMonitor(depth=3), weights]  # fmt: skip
    if stop_at is not None:
        driver.callbacks.append(StopAt(stop_at))
    driver.fit()
    return weights


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Weights, Weights, Path]:
    root = tmp_path_factory.mktemp("maxtext_callbacks")
    hf_dir = save_tiny_llama(root / "hf", vocab_size=512, initializer_range=0.3)
    whole = _run(hf_dir, root / "whole")
    resumed_dir = root / "resumed"
    _ = _run(hf_dir, resumed_dir, stop_at=2)  # after the step-2 checkpoint
    return whole, _run(hf_dir, resumed_dir, "--resume", "auto"), root


def test_frozen_until_the_step_then_trained_with_monitors(runs):
    weights, _, _ = runs
    frozen = [
        n for n in weights.after[0] if n.startswith(("model.embed_tokens.", "model.layers.0."))
    ]
    assert len(frozen) == 10
    for step in (1, 2, 3):
        assert all(np.array_equal(weights.after[step][n], weights.after[0][n]) for n in frozen)
        assert "grad_norm/model.layers.0" not in weights.logs[step]
        assert weights.logs[step]["grad_norm/model.layers.1"] > 0
    assert not any(np.array_equal(weights.after[4][n], weights.after[3][n]) for n in frozen)
    assert weights.logs[4]["grad_norm/model.layers.0"] > 0
    before, after = weights.after[3], weights.after[4]
    layer = [n for n in after if n.startswith("model.layers.1.")]
    norm = np.sqrt(sum(np.sum(after[n].astype(np.float64) ** 2) for n in layer))
    moved = np.sqrt(sum(np.sum((after[n] - before[n]).astype(np.float64) ** 2) for n in layer))
    assert weights.logs[4]["weight_norm/model.layers.1"] == pytest.approx(norm, rel=1e-5)
    assert weights.logs[4]["update_ratio/model.layers.1"] == pytest.approx(moved / norm, rel=1e-3)


def test_ema_is_the_average_of_each_steps_weights(runs):
    weights, _, _ = runs
    expected = dict(weights.after[1])
    for step in (2, 3, 4):
        expected = {
            n: DECAY * a + (1 - DECAY) * weights.after[step][n] for n, a in expected.items()
        }
    assert set(weights.averages) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(weights.averages[name], value, rtol=1e-6, atol=1e-7)


def test_a_resume_inside_the_frozen_window_freezes_again_and_ends_the_same(runs):
    whole, resumed, _ = runs
    assert sorted(resumed.after) == [2, 3, 4]
    frozen = [n for n in resumed.after[2] if n.startswith("model.layers.0.")]
    assert all(np.array_equal(resumed.after[3][n], resumed.after[2][n]) for n in frozen)
    for name, value in whole.after[4].items():
        assert np.array_equal(resumed.after[4][name], value), name
    for name, value in whole.averages.items():
        assert np.array_equal(resumed.averages[name], value), name


def test_exported_ema_weights_load_in_transformers(runs, tmp_path):
    from baton.tools.export import main as export_main

    weights, _, root = runs
    checkpoint = root / "whole" / "checkpoints" / "step_000004"
    assert export_main([str(checkpoint), str(tmp_path / "ema"), "--format", "hf", "--ema"]) == 0
    exported = load_llama(tmp_path / "ema").state_dict()
    for name, value in weights.averages.items():
        np.testing.assert_array_equal(exported[name].numpy(), value, err_msg=name)
