"""The Fabric backend: the quickstart trains, resume is exact, the README example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.core import Callback, CheckpointError, Driver
from baton.core.cli.recipe import build_driver
from support.docs_examples import docs_example
from support.recording import Losses

ROOT = Path(__file__).resolve().parents[3]


class SaveAt(Callback):
    def __init__(self, step: int) -> None:
        self.at = step

    def on_step_end(self, driver, output):
        if driver.step == self.at:
            driver.control.request_save("test", all_ranks=True)


def tiny(**overrides) -> GPTTraining:
    cfg = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        accelerator="cpu",
        warmup_steps=2,
        decay_steps=12,
        seed=3,
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def test_quickstart_trains_and_loss_falls(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "baton.core.cli.command",
            "run",
            str(ROOT / "recipes" / "quickstart.py"),
            "--max-steps",
            "60",
            "--log-every",
            "10",
            "--eval-every",
            "60",
            "--no-progress",
            "--run-dir",
            str(tmp_path / "qs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"step +\d+ \| loss ([0-9.]+)", out.stdout)]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.5, losses
    assert (tmp_path / "qs").is_dir()


def test_save_then_resume_gives_identical_losses(tmp_path):
    full = Losses()
    Driver(tiny().backend(), [full], max_steps=12, log_every=1, run_dir=tmp_path / "full").fit()

    first = Losses()
    Driver(
        tiny().backend(), [first, SaveAt(5)], max_steps=7, log_every=1, run_dir=tmp_path / "r"
    ).fit()
    second = Losses()
    result = Driver(
        tiny().backend(),
        [second],
        max_steps=12,
        log_every=1,
        run_dir=tmp_path / "r",
        resume=str(tmp_path / "r" / "checkpoints" / "step_000005"),
    ).fit()
    assert result.resumed_from.name == "step_000005"
    assert sorted(second.values) == list(range(6, 13))
    for step in range(6, 13):
        assert second.values[step] == full.values[step], step  # bitwise: same floats
    assert [first.values[s] for s in range(1, 6)] == [full.values[s] for s in range(1, 6)]


def test_resume_into_a_different_model_shape_fails_clearly(tmp_path):
    Driver(tiny().backend(), [SaveAt(2)], max_steps=2, run_dir=tmp_path).fit()
    bigger = tiny(model=GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=32))
    try:
        Driver(bigger.backend(), max_steps=4, run_dir=tmp_path, resume="auto").fit()
    except CheckpointError as error:
        assert "different setup" in str(error) and error.exit_status == 2  # bad input
        assert "model.n_layer: checkpoint has 1, this run has 2" in str(error)
    else:
        raise AssertionError("resume into another shape did not fail")


def test_eval_and_lazy_metrics(tmp_path):
    seen = {}

    class Grab(Callback):
        def on_step_end(self, driver, output):
            assert isinstance(output.loss, torch.Tensor)  # still a tensor, no sync made
            seen["tokens"] = output.tokens

        def on_eval_end(self, driver, metrics):
            seen["eval"] = metrics

    Driver(tiny().backend(), [Grab()], max_steps=2, eval_every=2, run_dir=tmp_path).fit()
    assert seen["tokens"] == 4 * 32
    assert set(seen["eval"]) == {"eval/loss"} and 0 < seen["eval"]["eval/loss"] < 10


def test_readme_custom_callback_example_runs(tmp_path, monkeypatch):
    code = docs_example("custom-callback")
    recipe = tmp_path / "early_stop.py"
    recipe.write_text(code)
    monkeypatch.chdir(tmp_path)
    driver = build_driver(recipe, ["--threshold", "3.2", "--max-steps", "200"])
    result = driver.fit()
    assert result.stop_reason.startswith("loss ") and "< 3.2" in result.stop_reason
    assert result.step < 200
    assert (tmp_path / "runs" / "early_stop").is_dir()
