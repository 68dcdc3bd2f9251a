"""Megatron-Core's ``OptimizerParamScheduler`` on baton's schedule: constant, linear and
cosine give, at every step, the ``lr`` of ``baton.core.lr_schedule`` bit for bit (what
every engine logs); Megatron's own formula with the same arguments gives the same floats
once the warmup has two steps to shift (with one it agrees to rounding, with none it
cannot start the decay one step in); and a recipe run logs exactly those rates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.lr_schedule import LRSchedule

ROOT = Path(__file__).parents[3]


def scheduler_rates(shape: LRSchedule, follow: bool) -> list[float]:
    """The rate of each update 1..total+2 of a ``BatonParamScheduler`` built as
    ``build_optimizer`` builds it (``follow``) or left on Megatron's own formula."""
    import torch

    from baton.backends.megatron.scheduler import BatonParamScheduler, schedule_arguments

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    scheduler = BatonParamScheduler(
        optimizer, **schedule_arguments(shape),  # pyright: ignore[reportArgumentType]
        start_wd=0.0, end_wd=0.0, wd_incr_steps=1, wd_incr_style="constant",
    )  # fmt: skip
    if follow:
        scheduler.follow(shape)
    rates = []
    for _ in range(shape.total_steps + 2):
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=1)
    return rates


@pytest.mark.parametrize("decay", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_every_shape_is_baton_s_bit_for_bit(decay: str, warmup: int) -> None:
    shape = LRSchedule(3e-3, 3e-4, warmup, 11, decay)
    expected = [shape.lr(k) for k in range(1, shape.total_steps + 3)]
    assert scheduler_rates(shape, follow=True) == expected  # the same floats
    own = scheduler_rates(shape, follow=False)  # Megatron's formula, shifted a step
    if warmup >= 2:
        assert own == expected  # the same floats, the plain Megatron loop's parity kept
    elif warmup == 1:  # no warmup left to shift: the first rate is floor + (peak - floor)
        assert own == pytest.approx(expected, rel=1e-12)


def test_a_recipe_run_logs_the_schedule_s_rates(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    result = subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", "run", "recipes/megatron_gpt_tiny.py",
         "--max-steps", "6", "--lr-schedule", "linear", "--warmup-steps", "2", "--lr", "2e-3",
         "--min-lr", "1e-4", "--log-every", "1", "--eval-every", "0", "--save-every", "0",
         "--no-async-save", "--no-progress", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    logged = [r["lr"] for r in read_jsonl(run_dir / "logs" / "metrics.jsonl") if "lr" in r]
    shape = LRSchedule(2e-3, 1e-4, 2, 6, "linear")
    assert logged == [shape.lr(k) for k in range(1, 7)]
