"""Freeze, then resume, on TorchTitan: parameters frozen from the first step never get
optimizer state, so the checkpoint holds none for them; resuming it (the optimizer state
a fresh run builds has every parameter's) loads, and the resumed run goes on bit for bit
as the run that was not stopped, through the step that trains them again (their Adam
state starts there, as it did in the first run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

import torch

from baton.callbacks.freeze import Freeze
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.recording import Losses
from support.tiny_llama import save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
FROZEN = ["model.norm.weight", "model.layers.0.mlp.*"]
UNTIL = 4  # frozen for steps 1-4, trained from step 5


class LastWeights(Callback):
    """Every parameter (Hugging Face names) after the run's last step."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor] = {}

    def on_step_end(self, driver, output) -> None:
        if driver.step == driver.options.max_steps:
            pieces = driver.backend.model_state().parameters()
            self.values = {p.name: p.value.clone() for p in pieces}


def run(source: Path, run_dir: Path, *more: str) -> tuple[Losses, LastWeights]:
    driver = build_driver(RECIPE, [
        "--init-from", str(source), "--max-steps", "6", "--seq-len", "64",
        "--batch-size", "2", "--log-every", "1", "--save-every", "2",
        "--run-dir", str(run_dir), "--no-progress", *more,
    ])  # fmt: skip
    losses, weights = Losses(), LastWeights()
    driver.callbacks += [Freeze(FROZEN, until_step=UNTIL), losses, weights]
    driver.fit()
    return losses, weights


def test_freeze_then_resume_continues_bit_for_bit(tmp_path: Path):
    source = save_tiny_llama(tmp_path / "hf")
    whole, whole_weights = run(source, tmp_path / "whole")
    # a run stopped after step 4 (saved with the parameters still frozen): its
    # checkpoints folder holds step 4's
    shutil.copytree(
        tmp_path / "whole" / "checkpoints" / "step_000004",
        tmp_path / "resumed" / "checkpoints" / "step_000004",
    )
    resumed, resumed_weights = run(source, tmp_path / "resumed", "--resume", "auto")
    assert sorted(resumed.values) == [5, 6]
    assert resumed.values == {step: whole.values[step] for step in (5, 6)}
    assert "model.norm.weight" in whole_weights.values
    assert whole_weights.values.keys() == resumed_weights.values.keys()
    for name, value in whole_weights.values.items():
        assert torch.equal(resumed_weights.values[name], value), name
