"""Test recipe for the goodput ledger: a tiny GPT with evaluation, asynchronous saves
and ``Goodput`` writing a line after every step.

uv run baton run tests/callbacks/recipe_goodput.py --run-dir /tmp/r --max-steps 40

Each step sleeps ``slow_ms`` first (so a test can kill the run mid-way) and prints
``STEP n`` once the ledger holds step ``n``.
"""

from __future__ import annotations

import time
from typing import Any

from baton.backends.fabric import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, CompositeLogger, Goodput
from baton.core import Callback, Driver
from baton.core.callback import METRIC_PRIORITY


class SlowStepMarker(Callback):
    """Sleep before each step; print ``STEP n`` after ``Goodput`` recorded it."""

    priority = METRIC_PRIORITY + 1

    def __init__(self, slow_ms: float) -> None:
        self.slow_ms = slow_ms

    def on_step_start(self, driver: Driver) -> None:
        time.sleep(self.slow_ms / 1000)

    def on_step_end(self, driver: Driver, output: Any) -> None:
        print(f"STEP {driver.step}", flush=True)


def recipe(
    run_dir: str,
    max_steps: int = 40,
    every_n_steps: int = 4,
    eval_every: int = 5,
    slow_ms: float = 100.0,
) -> Driver:
    """Tiny GPT, evaluated every ``eval_every`` steps, saved asynchronously."""
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=max_steps,
        accelerator="cpu",
        eval_batches=2,
    )
    return Driver(
        config.backend(),
        [
            Checkpoint(every_n_steps=every_n_steps, keep_last=None, async_save=True),
            Goodput(interval_s=0),
            CompositeLogger(["jsonl"]),
            SlowStepMarker(slow_ms),
        ],
        max_steps=max_steps,
        log_every=5,
        eval_every=eval_every,
        run_dir=run_dir,
    )
