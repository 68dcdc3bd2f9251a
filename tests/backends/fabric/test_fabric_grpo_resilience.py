"""A Fabric GRPO run keeps what every run has: ``LossGuard`` (``--callback
loss_guard:action=rollback``) goes back from a broken step to the last checkpoint, and
the rolled-back steps sample the same rollouts again from the rollout phase's restored
state and train to the same weights, bit for bit (a run on rollouts has no rows to skip);
``Freeze`` leaves its parameters as loaded while the others train; ``EMA``'s averages are
the weights' average, and ``baton export --ema`` writes them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from baton.callbacks import EMA, Freeze, LossGuard
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.grpo import learning_flags
from support.resilience import LoggedMetrics, StepWeights, check_ema, check_frozen

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
FROZEN = ["model.layers.0.*"]
#: what a step logs that training decides (not its times)
TRAINED = ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "reward", "reward_std")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def fit(files: dict[str, Path], run_dir: Path, callbacks: list[Callback], *extra: str):
    """The learning task (transformers sampling), logged every step."""
    args = [
        *learning_flags(files, max_prompt_length=24), "--batch-size", "16", "--lr", "5e-3",
        "--seq-len", "32", "--log-every", "1", "--run-dir", str(run_dir), "--no-progress",
        *extra,
    ]  # fmt: skip
    driver = build_driver(RECIPE, args)
    assert driver is not None
    driver.callbacks += callbacks
    driver.fit()
    return driver


class NaNLogitsAt(Callback):
    """Step ``at`` (once) computes NaN logits: its loss, gradients and weights break."""

    def __init__(self, at: int) -> None:
        self.at, self.hook = at, None

    def on_step_start(self, driver) -> None:
        if driver.step + 1 == self.at and self.hook is None:
            head = driver.backend.raw_model.lm_head
            self.hook = head.register_forward_hook(lambda _m, _i, out: out * float("nan"))

    def on_step_end(self, driver, output) -> None:
        if self.hook is not None and driver.step == self.at:
            self.hook.remove()


def test_loss_guard_rolls_back_a_nan_grpo_step_and_replays_it(grpo_assets, tmp_path):
    """Step 5's logits are NaN: LossGuard refuses its save, goes back to the step-4
    checkpoint, and steps 5-6 sample the rollouts of the run that never broke and log
    its losses; both end on the same weights."""
    files = grpo_assets["files"]
    straight, straight_weights = LoggedMetrics(), StepWeights()
    fit(files, tmp_path / "straight", [straight, straight_weights], "--max-steps", "6",
        "--save-every", "2")  # fmt: skip
    guarded, guarded_weights = LoggedMetrics(), StepWeights()
    driver = fit(files, tmp_path / "guarded", [NaNLogitsAt(5), guarded, guarded_weights],
                 "--max-steps", "6", "--save-every", "2",
                 "--callback", "loss_guard:action=rollback")  # fmt: skip
    (guard,) = [c for c in driver.callbacks if isinstance(c, LossGuard)]
    assert guard.rollbacks == 1
    assert [step for step, _ in guarded.logged] == [1, 2, 3, 4, 5, 5, 6]
    assert math.isnan(guarded.logged[4][1]["loss"])
    want, got = straight.metrics, guarded.metrics
    for step in range(1, 7):
        assert [got[step][k] for k in TRAINED] == [want[step][k] for k in TRAINED], step
    assert len({want[step]["grad_norm"] for step in range(1, 7)}) == 6  # each its own
    for name, value in straight_weights.values[6].items():
        assert np.array_equal(guarded_weights.values[6][name], value), name
    records = [tmp_path / run / "logs" / "rollouts.jsonl" for run in ("straight", "guarded")]
    assert records[0].read_bytes() == records[1].read_bytes()  # step 5's sampled once more
    names = sorted(p.name for p in (tmp_path / "guarded" / "checkpoints").glob("step_*"))
    assert names == ["step_000004", "step_000006"]  # keep_last=2; no save of step 5


def test_freeze_and_ema_on_grpo_and_the_ema_export(grpo_assets, tmp_path):
    """Layer 0 frozen for the whole run: its weights never move while every other
    parameter changes at every step; EMA(0.5)'s averages equal the weights' average, and
    ``baton export --ema`` of the step-3 checkpoint writes them (the plain export the
    trained weights)."""
    from safetensors.torch import load_file

    from baton.tools.export import main as export_main

    files = grpo_assets["files"]
    weights, ema = StepWeights(), EMA(decay=0.5)
    fit(files, tmp_path / "run", [Freeze(FROZEN), ema, weights], "--max-steps", "3",
        "--save-every", "3")  # fmt: skip
    check_frozen(weights, FROZEN)
    check_ema(weights, ema.averages, decay=0.5)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000003"
    assert export_main([str(checkpoint), str(tmp_path / "ema"), "--format", "hf", "--ema"]) == 0
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    averaged = load_file(str(tmp_path / "ema" / "model.safetensors"))
    trained = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(averaged) == set(trained) == set(ema.averages)
    for name, value in ema.averages.items():
        assert np.array_equal(averaged[name].numpy(), value.detach().cpu().numpy()), name
        assert np.array_equal(trained[name].numpy(), weights.values[3][name]), name
    moved = [n for n in trained if not np.array_equal(averaged[n].numpy(), trained[n].numpy())]
    assert moved and not any(n.startswith("model.layers.0.") for n in moved)
