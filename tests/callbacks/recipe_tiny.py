"""Test recipe: a tiny GPT with Checkpoint, CompositeLogger and Preemption (CPU, ms per step).

uv run baton run tests/callbacks/recipe_tiny.py --run-dir /tmp/r --max-steps 30 --resume auto

``--fail-save-at N`` makes the save of step N fail part-way (a simulated write
error: half the state file written, then ``OSError``), for the rotation tests.
``--slow-ms`` sleeps each step so a test can send signals mid-run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from baton.backends.fabric import FabricBackend
from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, CompositeLogger, Preemption, ThroughputMonitor
from baton.core import Callback, Driver


class FlakyDiskFabric(FabricBackend):
    """The Fabric backend whose save of one step dies part-way with a write error."""

    fail_at = 0
    step = 0

    def train_step(self, step: int) -> Any:
        self.step = step
        return super().train_step(step)

    def save(self, directory: Path, *, asynchronous: bool = False) -> Any:
        result = super().save(directory, asynchronous=False)
        if self.step == self.fail_at:
            state = Path(directory) / "state.pt"
            data = state.read_bytes()
            state.write_bytes(data[: len(data) // 2])
            raise OSError(28, f"No space left on device (simulated at step {self.step})")
        return result


class StepMarker(Callback):
    """Print ``STEP n`` after each step (tests watch for it) and optionally slow down."""

    def __init__(self, slow_ms: float) -> None:
        self.slow_ms = slow_ms

    def on_step_end(self, driver: Driver, output: Any) -> None:
        print(f"STEP {driver.step}", flush=True)
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000)


def recipe(
    run_dir: str,
    max_steps: int = 30,
    every_n_steps: int = 5,
    keep_last: int = 2,
    log_every: int = 5,
    async_save: bool = False,
    slow_ms: float = 0.0,
    fail_save_at: int = 0,
) -> Driver:
    """Tiny GPT for callback tests."""
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=max_steps,
        accelerator="cpu",
        eval_batches=2,
    )
    backend = config.backend(FlakyDiskFabric)
    backend.fail_at = fail_save_at
    return Driver(
        backend,
        [
            Checkpoint(every_n_steps=every_n_steps, keep_last=keep_last, async_save=async_save),
            Preemption(),
            ThroughputMonitor(),
            CompositeLogger(["jsonl"]),
            StepMarker(slow_ms),
        ],
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
    )
