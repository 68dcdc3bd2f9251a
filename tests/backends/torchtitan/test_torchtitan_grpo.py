"""GRPO on TorchTitan (recipes/torchtitan_llama3_debug.py): each step's rollouts come from
the rollout phase, TorchTitan's ``Trainer.train_step`` reads this rank's share of them
(``torchtitan/rollout_rows.py``) and trains GRPO's declared loss as its loss function.

On the fixed rollouts of ``support.grpo`` (replayed by ``--generator recorded:``), the
first step's loss, gradient norm and TRL's metrics equal TRL's ``GRPOTrainer`` (fp32,
CPU; TorchTitan's AdamW made TRL's with ``--set``, a constant learning rate), for
``dapo`` and ``grpo``, beta 0 and 0.04, and with ``--num-iterations 2`` the second step,
whose ratios differ from 1. The policy learns a task on a CPU (``learning_flags``), with
the ``transformers`` generator loading the weights TorchTitan gathered each step. Bad
input is refused from the command line in one line, exit status 2, nothing written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("trl")

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.grpo import grpo_flags, learned, learning_flags
from support.posttrain import LoggedMetrics

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
#: rows hold the longest prompt (24 tokens) and completion (10)
SEQ = 40
#: TorchTitan's AdamW as TRL's (betas, eps, no weight decay), clipping at 1.0, and the
#: recipe's warmup-cosine schedule held at the peak: a constant learning rate
TRL_OPTIMIZER = [
    "--warmup-steps", "0",
    "--set", "optimizer.param_groups.0.optimizer_kwargs.betas=[0.9,0.999]",
    "--set", "optimizer.param_groups.0.optimizer_kwargs.eps=1.0e-8",
    "--set", "optimizer.param_groups.0.optimizer_kwargs.weight_decay=0.0",
    "--set", "training.max_norm=1.0",
]  # fmt: skip
#: TRL's metrics of the loss each step must equal
LOSS_METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def fixed_flags(files: dict[str, Path], run_dir: Path, *extra: str, **settings: Any) -> list[str]:
    """A GRPO run on the fixed rollouts (every prompt in one step of 16 rollouts)."""
    return [
        *grpo_flags(files, max_prompt_length=24, **settings),
        "--seq-len", str(SEQ), "--batch-size", "16", "--lr", "1e-3", "--min-lr", "1e-3",
        "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--run-dir", str(run_dir), "--no-progress", *TRL_OPTIMIZER, *extra,
    ]  # fmt: skip


def fit(flags: list[str], *callbacks: Callback) -> LoggedMetrics:
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, flags)
    assert driver is not None
    driver.callbacks += [logged, *callbacks]
    driver.fit()
    return logged


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_first_grpo_step_equals_trl(grpo_assets, loss_type, beta, tmp_path):
    files = grpo_assets["files"]
    flags = fixed_flags(files, tmp_path / "run", loss_type=loss_type, beta=beta)
    first = fit(flags).metrics[1]
    trl = grpo_assets["reference"](loss_type=loss_type, beta=beta, steps=1)[0]
    print(f"{loss_type} beta {beta}: loss {first['loss']!r} (TRL {trl['loss']!r}), "
          f"grad_norm {first['grad_norm']!r} (TRL {trl['grad_norm']!r})")  # fmt: skip
    # grpo's loss at ratio 1 is minus the mean advantage: 0 up to rounding
    zero = abs(trl["loss"]) < 1e-6
    assert first["loss"] == pytest.approx(trl["loss"], rel=1e-5, abs=1e-6 if zero else 0.0)
    assert first["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)
    for name in (*LOSS_METRICS, *(("kl",) if beta else ())):
        assert first[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-7), name
    for name in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length"):
        assert first[name] == pytest.approx(trl[name], rel=1e-6), name


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_second_iteration_on_the_same_rollouts_equals_trl(grpo_assets, beta, tmp_path):
    """``--num-iterations 2``: step 2 trains on step 1's rollouts again, against their
    sampling log-probabilities, after step 1's update (ratios differ from 1: some are
    clipped; with beta > 0 the policy has left the reference: a KL above 0)."""
    files = grpo_assets["files"]
    flags = fixed_flags(files, tmp_path / "run", "--max-steps", "2", num_iterations=2, beta=beta)
    logged = fit(flags).metrics
    trl = grpo_assets["reference"](num_iterations=2, steps=2, beta=beta)
    if beta:
        assert logged[2]["kl"] > 1e-6
        assert logged[2]["kl"] == pytest.approx(trl[1]["kl"], rel=1e-4)
    print(f"num_iterations 2, beta {beta}, step 2: loss {logged[2]['loss']!r} (TRL {trl[1]['loss']!r}), "
          f"grad_norm {logged[2]['grad_norm']!r} (TRL {trl[1]['grad_norm']!r})")  # fmt: skip
    assert logged[2]["clip_ratio/region_mean"] > 0
    for step in (1, 2):
        assert logged[step]["loss"] == pytest.approx(trl[step - 1]["loss"], rel=1e-5), step
        assert logged[step]["grad_norm"] == pytest.approx(trl[step - 1]["grad_norm"], rel=1e-5)
        for name in LOSS_METRICS:
            assert logged[step][name] == pytest.approx(trl[step - 1][name], rel=1e-5, abs=1e-7)
    assert logged[2]["timing/generation_s"] == 0.0  # the same rollouts, none sampled


@pytest.mark.slow
def test_the_policy_learns_on_a_cpu(grpo_assets, tmp_path):
    """``learning_flags``: the ``transformers`` generator samples with the weights
    TorchTitan gathers after each step; the mean reward rises by ``LEARNING_MARGIN``."""
    files = grpo_assets["files"]
    flags = [
        *learning_flags(files, max_prompt_length=24),
        "--batch-size", "16", "--lr", "5e-3", "--min-lr", "5e-3", "--seq-len", "32",
        "--log-every", "1", "--save-every", "0", "--run-dir", str(tmp_path / "run"),
        "--no-progress", *TRL_OPTIMIZER,
    ]  # fmt: skip
    started = time.monotonic()
    logged = fit(flags).metrics
    seconds = time.monotonic() - started
    rewards = [logged[step]["reward"] for step in sorted(logged)]
    print(f"TorchTitan GRPO learning run: {seconds:.1f} s, rewards {np.round(rewards, 3)}")
    assert learned(rewards), rewards
    assert all(logged[step]["timing/weight_sync_s"] > 0 for step in logged)  # every step
    assert seconds < 60
