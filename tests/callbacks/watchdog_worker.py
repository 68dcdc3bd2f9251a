"""A 2-rank run under torchrun for the watchdog test: a tiny Fabric DDP GPT on gloo,
saved every 4 steps, resumed with ``resume="auto"`` after a restart.

    torchrun --nproc-per-node 2 watchdog_worker.py RUN_DIR [--sleep-rank R --sleep-at N]

With ``--sleep-rank``, that rank sleeps inside step N (in ``on_step_end``, before the
watchdog sees the step end) for ten minutes, once per run directory: the watchdog
(``action="abort"``) must name it, dump both ranks' stacks and end the job, and the
restarted job must finish.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, Watchdog
from baton.core import Callback, Driver


class SleepInStep(Callback):
    """Rank ``rank`` sleeps in step ``at`` (the first time only: a marker file in the run
    directory says it already did)."""

    def __init__(self, rank: int, at: int) -> None:
        self.rank, self.at = rank, at

    def on_step_end(self, driver: Driver, output: Any) -> None:
        marker = driver.options.run_dir / "slept"
        if driver.backend.rank == self.rank and driver.step == self.at and not marker.exists():
            marker.touch()
            hang_here()


def hang_here() -> None:
    """Ten minutes asleep: a hang, as far as the other rank and the watchdog can tell."""
    time.sleep(600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sleep-rank", type=int, default=None)
    parser.add_argument("--sleep-at", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    backend = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=12,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        seed=3,
    ).backend()
    callbacks: list[Callback] = [
        Checkpoint(every_n_steps=4, keep_last=None),
        Watchdog(timeout_s=10, poll_s=0.5, action="abort", grace_s=20),
    ]
    if args.sleep_rank is not None:
        callbacks.append(SleepInStep(args.sleep_rank, args.sleep_at))
    Driver(backend, callbacks, max_steps=12, log_every=4, run_dir=args.run_dir,
           resume="auto").fit()  # fmt: skip


if __name__ == "__main__":
    main()
