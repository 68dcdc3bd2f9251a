"""Freeze, WeightMonitor and GradientNormMonitor on Fabric (a transformers Llama from
``recipes/hf_finetune.py``, Hugging Face names), the same callbacks the JAX backend's
tests run: frozen weights bitwise unchanged until the step, then trained; weight norms
and update ratios as the test computes them from the weights; no gradient shown for a
frozen layer."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from baton.callbacks import Freeze, GradientNormMonitor, WeightMonitor
from baton.core import Callback
from baton.core.cli.recipe import build_driver

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "hf_finetune.py"
FROZEN = ["model.embed_tokens.*", "model.layers.0.*"]


class Weights(Callback):
    def __init__(self) -> None:
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self.logs: dict[int, dict[str, float]] = {}

    def on_train_start(self, driver):
        self.after[driver.step] = self.copy(driver)

    def on_step_end(self, driver, output):
        self.after[driver.step] = self.copy(driver)

    def on_log(self, driver, metrics):
        self.logs[driver.step] = dict(metrics)

    @staticmethod
    def copy(driver):
        return {p.name: p.value.clone() for p in driver.backend.model_state().parameters()}


def test_freeze_weight_and_gradient_monitors_on_fabric(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_finetune_recipe", RECIPE)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    source = recipe.save_tiny_llama(tmp_path / "tiny-llama")
    args = ["--init-from", str(source), "--max-steps", "3", "--log-every", "1"]
    driver = build_driver(RECIPE, [*args, "--save-every", "0", "--run-dir", str(tmp_path / "run")])
    weights = Weights()
    driver.callbacks += [Freeze(FROZEN, until_step=2), WeightMonitor(depth=3),
                         GradientNormMonitor(depth=3), weights]  # fmt: skip
    driver.fit()
    frozen = [
        n for n in weights.after[0] if n.startswith(("model.embed_tokens.", "model.layers.0."))
    ]
    assert frozen
    for step in (1, 2):
        assert all(torch.equal(weights.after[step][n], weights.after[0][n]) for n in frozen)
        assert "grad_norm/model.layers.0" not in weights.logs[step]
        assert weights.logs[step]["grad_norm/model.layers.1"] > 0
    assert not any(torch.equal(weights.after[3][n], weights.after[2][n]) for n in frozen)
    assert weights.logs[3]["grad_norm/model.layers.0"] > 0
    for step in (1, 3):
        before, after = weights.after[step - 1], weights.after[step]
        layer = [n for n in after if n.startswith("model.layers.1.")]
        norm = math.sqrt(sum(after[n].double().square().sum().item() for n in layer))
        moved = math.sqrt(sum((after[n] - before[n]).double().square().sum().item() for n in layer))
        assert weights.logs[step]["weight_norm/model.layers.1"] == pytest.approx(norm, rel=1e-5)
        assert weights.logs[step]["update_ratio/model.layers.1"] == pytest.approx(
            moved / norm, rel=1e-3
        )
