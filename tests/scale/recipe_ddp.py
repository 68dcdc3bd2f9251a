"""Test recipe for scale-out: a tiny GPT under Fabric DDP on as many CPU ranks as the
launcher (torchrun, SLURM) started, with checkpoints, preemption and a kill switch.

uv run torchrun --nproc-per-node 2 -m baton.core.cli.command run tests/scale/recipe_ddp.py \\
    --run-dir /tmp/r --max-steps 30

``--die-at-step N`` SIGKILLs rank ``--die-rank`` at step N of the job's first attempt
(an elastic restart's workers run on); ``--slow-ms`` sleeps each step so that a test can
act mid-run; ``STEP n`` lines (rank 0) tell a test where the run is.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, CompositeLogger, Preemption
from baton.core import Callback, Driver
from baton.core.launch import restart_count


class StepMarker(Callback):
    """Rank 0 prints ``STEP n`` after each step; every rank sleeps ``slow_ms``."""

    def __init__(self, slow_ms: float) -> None:
        self.slow_ms = slow_ms

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.is_global_zero:
            print(f"STEP {driver.step} world {driver.backend.world_size}", flush=True)
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000)


class DieAtStep(Callback):
    """SIGKILL this process at ``step`` on rank ``rank``, on the job's first attempt only."""

    def __init__(self, step: int, rank: int) -> None:
        self.step, self.rank = step, rank

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == self.step and driver.backend.rank == self.rank and not restart_count():
            print(f"KILLING rank {self.rank} at step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def recipe(
    run_dir: str,
    max_steps: int = 30,
    every_n_steps: int = 5,
    slow_ms: float = 0.0,
    die_at_step: int = 0,
    die_rank: int = 1,
    decay_steps: int = 20,
) -> Driver:
    """Tiny GPT, data parallel over the launched ranks (devices, nodes and DDP from the
    launcher)."""
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=decay_steps,  # not max_steps: a run may stop early and be resumed
        accelerator="cpu",
    )
    callbacks: list[Callback] = [
        Checkpoint(every_n_steps=every_n_steps, keep_last=2),
        Preemption(),
        CompositeLogger(["jsonl"]),
        StepMarker(slow_ms),
    ]
    if die_at_step:
        callbacks.append(DieAtStep(die_at_step, die_rank))
    return Driver(config.backend(), callbacks, max_steps=max_steps, log_every=5, run_dir=run_dir)
