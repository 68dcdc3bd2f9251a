"""Test recipe for the goodput step mark: the scalar backend saved every ``save_every``
steps, ``Goodput`` writing ledger lines only at setup and teardown (an hour apart at
most), and a real SIGKILL of its own process once step ``kill_at`` is recorded.

PYTHONPATH=tests uv run baton run tests/callbacks/recipe_goodput_kill.py \\
    --run-dir /tmp/r --max-steps 16 --save-every 5 --kill-at 13

Each step sleeps ``slow_ms`` (a real model's step takes time) and prints ``STEP n``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from baton.callbacks import Checkpoint, CompositeLogger, Goodput
from baton.core import Callback, Driver
from baton.core.callback import METRIC_PRIORITY
from support.scalar_backend import ScalarBackend


class KillAt(Callback):
    """Sleep in each step; SIGKILL this process after ``Goodput`` recorded ``step``."""

    priority = METRIC_PRIORITY + 1

    def __init__(self, step: int, slow_ms: float) -> None:
        self.step, self.slow_ms = step, slow_ms

    def on_step_start(self, driver: Driver) -> None:
        time.sleep(self.slow_ms / 1000)

    def on_step_end(self, driver: Driver, output: Any) -> None:
        print(f"STEP {driver.step}", flush=True)
        if driver.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def recipe(
    run_dir: str, max_steps: int = 16, save_every: int = 5, kill_at: int = 0, slow_ms: float = 20.0
) -> Driver:
    """Gradient descent on a scalar, killed at step ``kill_at`` (0: never)."""
    return Driver(
        ScalarBackend(),
        [
            Checkpoint(every_n_steps=save_every, keep_last=None),
            Goodput(interval_s=3600),
            CompositeLogger(["jsonl"]),
            KillAt(kill_at, slow_ms),
        ],
        max_steps=max_steps,
        log_every=1,
        run_dir=run_dir,
    )
