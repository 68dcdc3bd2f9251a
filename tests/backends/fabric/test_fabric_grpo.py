"""GRPO on the Fabric backend (recipes/hf_finetune.py --objective grpo): each step's
rollouts come from the rollout phase, the backend's step reads this rank's share of them
(``fabric/rollout_rows.py``) and trains GRPO's declared loss (``ObjectiveLoss``).

On the fixed rollouts of ``support.grpo`` (replayed by ``--generator recorded:``), the
first step's loss, gradient norm and TRL's metrics equal TRL's ``GRPOTrainer`` (fp32,
CPU; the recipe's optimizer is TRL's: AdamW with its default betas and eps, no weight
decay, clipping at 1.0, a constant learning rate), for ``dapo`` and ``grpo``, beta 0 and
0.04, and with ``--num-iterations 2`` the second step, whose ratios differ from 1. Two
DDP ranks give one rank's first step. The policy learns a task on a CPU
(``learning_flags``), with the ``transformers`` generator loading the weights the
backend gathers after each step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("trl")

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from support.grpo import grpo_flags, learned, learning_flags
from support.posttrain import LoggedMetrics

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
#: rows hold the longest prompt (24 tokens) and completion (10)
SEQ = 40
#: TRL's metrics of the loss each step must equal
LOSS_METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
#: TRL's metrics of the rollouts
ROLLOUT_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def fixed_flags(files: dict[str, Path], run_dir: Path, *extra: str, **settings: Any) -> list[str]:
    """A GRPO run on the fixed rollouts (every prompt in one step of 16 rollouts), with
    the recipe's optimizer (TRL's) at a constant 1e-3."""
    return [
        *grpo_flags(files, max_prompt_length=24, **settings),
        "--seq-len", str(SEQ), "--batch-size", "16", "--lr", "1e-3", "--grad-clip", "1.0",
        "--max-steps", "1", "--log-every", "1", "--save-every", "0",
        "--run-dir", str(run_dir), "--no-progress", *extra,
    ]  # fmt: skip


def fit(flags: list[str], *callbacks: Callback) -> LoggedMetrics:
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, flags)
    assert driver is not None
    driver.callbacks += [logged, *callbacks]
    driver.fit()
    return logged


def check_step(got: dict[str, float], trl: dict[str, float], beta: float) -> None:
    """A step's loss, gradient norm and metrics equal TRL's (1e-5 relative; grpo's loss
    at ratio 1 is minus the mean advantage, 0 up to rounding: an absolute 1e-6)."""
    zero = abs(trl["loss"]) < 1e-6
    assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5, abs=1e-6 if zero else 0.0)
    assert got["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)
    for name in (*LOSS_METRICS, *(("kl",) if beta else ())):
        assert got[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_first_grpo_step_equals_trl(grpo_assets, loss_type, beta, tmp_path):
    files = grpo_assets["files"]
    first = fit(fixed_flags(files, tmp_path / "run", loss_type=loss_type, beta=beta)).metrics[1]
    trl = grpo_assets["reference"](loss_type=loss_type, beta=beta, steps=1)[0]
    print(f"fabric {loss_type} beta {beta}: loss {first['loss']!r} (TRL {trl['loss']!r}), "
          f"grad_norm {first['grad_norm']!r} (TRL {trl['grad_norm']!r})")  # fmt: skip
    check_step(first, trl, beta)
    for name in ROLLOUT_METRICS:
        assert first[name] == pytest.approx(trl[name], rel=1e-6), name


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_micro_batches_leave_the_step_as_trl_s(grpo_assets, loss_type, tmp_path):
    """The 16 rollouts as 4 micro-batches of 4 (``--grad-accum 4``): the loss is still
    the mean over the global batch, so the step is TRL's on all 16 at once."""
    files = grpo_assets["files"]
    flags = fixed_flags(files, tmp_path / "run", "--grad-accum", "4", loss_type=loss_type)
    flags[flags.index("--batch-size") + 1] = "4"
    first = fit(flags).metrics[1]
    check_step(first, grpo_assets["reference"](loss_type=loss_type, beta=0.0, steps=1)[0], 0.0)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_second_iteration_on_the_same_rollouts_equals_trl(grpo_assets, beta, tmp_path):
    """``--num-iterations 2``: step 2 trains on step 1's rollouts again, against their
    sampling log-probabilities, after step 1's update (ratios differ from 1: some are
    clipped; with beta > 0 the policy has left the reference: a KL above 0)."""
    files = grpo_assets["files"]
    flags = fixed_flags(files, tmp_path / "run", "--max-steps", "2", num_iterations=2, beta=beta)
    logged = fit(flags).metrics
    trl = grpo_assets["reference"](num_iterations=2, steps=2, beta=beta)
    print(f"fabric num_iterations 2 beta {beta}, step 2: loss {logged[2]['loss']!r} "
          f"(TRL {trl[1]['loss']!r}), grad_norm {logged[2]['grad_norm']!r} "
          f"(TRL {trl[1]['grad_norm']!r}), clip_ratio/region_mean "
          f"{logged[2]['clip_ratio/region_mean']!r} (TRL {trl[1]['clip_ratio/region_mean']!r})")  # fmt: skip
    assert logged[2]["clip_ratio/region_mean"] > 0
    if beta:
        assert logged[2]["kl"] > 1e-6
    for step in (1, 2):
        check_step(logged[step], trl[step - 1], beta)
    assert logged[2]["timing/generation_s"] == 0.0  # the same rollouts, none sampled


def test_the_rollout_records_hold_what_the_loss_used(grpo_assets, tmp_path):
    """``logs/rollouts.jsonl`` holds every completion of the step, with the advantage and
    the sampling log-probabilities the loss read (the fixed rollouts' own)."""
    from support.grpo import read_rollouts

    files = grpo_assets["files"]
    fit(fixed_flags(files, tmp_path / "run"))
    written = read_rollouts(tmp_path / "run" / "logs" / "rollouts.jsonl")
    fixed = read_rollouts(files["rollouts"])
    assert len(written) == len(fixed) == 16
    by_completion = {(r["prompt_index"], tuple(r["completion_ids"])): r for r in fixed}
    for record in written:  # in the step's prompt order, each group together
        source = by_completion.pop((record["prompt_index"], tuple(record["completion_ids"])))
        assert record["logps"] == source["logps"]
        assert record["rewards"] == {"recorded": source["reward"]}
    assert not by_completion
    advantages = np.array([r["advantage"] for r in written]).reshape(4, 4)
    assert np.allclose(advantages.sum(axis=1), 0.0, atol=1e-5)  # relative to each group


@pytest.mark.slow
def test_two_ddp_ranks_equal_one_rank(grpo_assets, tmp_path, monkeypatch):
    """Under torchrun (2 ranks, gloo, ``--strategy ddp``) each rank trains 8 of the 16
    fixed rollouts (a group of 4 split over the micro-batch of each rank: groups need
    not stay whole): the step's loss, gradient norm and metrics equal one rank's."""
    from support.torchrun import torchrun

    files = grpo_assets["files"]
    one = fit(fixed_flags(files, tmp_path / "one", beta=0.04)).metrics[1]
    cli = ROOT / "packages" / "core" / "src" / "baton" / "core" / "cli" / "command.py"
    flags = fixed_flags(files, tmp_path / "ddp", "--strategy", "ddp", beta=0.04)
    flags[flags.index("--batch-size") + 1] = "8"
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))  # the reward imports support.grpo
    torchrun(cli, "run", str(RECIPE), *flags)
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "logs" / "metrics.jsonl").open()]
    two = next(row for row in rows if row.get("step") == 1 and "loss" in row)
    print(f"fabric DDP 2: loss {two['loss']!r} (one rank {one['loss']!r}), grad_norm "
          f"{two['grad_norm']!r} (one rank {one['grad_norm']!r})")  # fmt: skip
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name in (*LOSS_METRICS, "kl", *ROLLOUT_METRICS):
        assert two[name] == pytest.approx(one[name], rel=1e-5, abs=1e-7), name


@pytest.mark.slow
def test_the_policy_learns_on_a_cpu(grpo_assets, tmp_path):
    """``learning_flags``: the ``transformers`` generator samples with the weights the
    backend gathers after each step; the mean reward rises by ``LEARNING_MARGIN``."""
    files = grpo_assets["files"]
    flags = [
        *learning_flags(files, max_prompt_length=24),
        "--batch-size", "16", "--lr", "5e-3", "--seq-len", "32", "--log-every", "1",
        "--save-every", "0", "--run-dir", str(tmp_path / "run"), "--no-progress",
    ]  # fmt: skip
    started = time.monotonic()
    logged = fit(flags).metrics
    seconds = time.monotonic() - started
    rewards = [logged[step]["reward"] for step in sorted(logged)]
    print(f"fabric GRPO learning run: {seconds:.1f} s, rewards {np.round(rewards, 3).tolist()}")
    assert learned(rewards), rewards
    assert all(logged[step]["timing/weight_sync_s"] > 0 for step in logged)  # every step
    assert seconds < 60
