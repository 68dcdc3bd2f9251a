"""The standard callbacks under 2 CPU ranks: run by ``test_multirank.py`` under torchrun.

Several short runs share one process group (one torchrun launch): each builds a new
Driver over a tiny Fabric DDP GPT on gloo. Every rank writes what it saw to
``<out>/rank<r>.json``; the test compares the ranks and the runs.

Runs:
    guard_stop      rank 1 alone gets NaN weights before step 8 (a checkpoint step):
                    rank 0's own loss there is finite, yet both stop at 8, unsaved
    guard_rollback  the same with ``action="rollback"``: both roll back to step 4
    uninterrupted   12 steps with checkpoints every 3 (keep_last=2): the reference
    preempted       the same, SIGTERM to rank 1 alone at step 5: both save step 8, stop
    resumed         ``resume="auto"`` from it to step 12
    early_stop      a score only rank 1 sees stalling: both stop at the next log step,
                    with ThroughputMonitor, evaluation and CompositeLogger (rank 0 writes)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import (
    Checkpoint,
    CompositeLogger,
    EarlyStopping,
    LossGuard,
    Preemption,
    ThroughputMonitor,
)
from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt


class StepLosses(Callback):
    """Every step's local loss on this rank (kept lazy; fetched once at the end)."""

    def __init__(self) -> None:
        self.losses: dict[int, torch.Tensor] = {}

    def on_step_end(self, driver: Driver, output: Any) -> None:
        self.losses[driver.step] = output.loss.detach().clone()

    def as_list(self) -> list[list[float]]:
        return [[s, float(self.losses[s])] for s in sorted(self.losses)]


class LoggedLosses(Callback):
    """The local ``loss`` this rank saw on each log step (before any reduction)."""

    priority = 400

    def __init__(self) -> None:
        self.logged: list[list[float]] = []

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.logged.append([driver.step, metrics["loss"]])


class PoisonOnRank(Callback):
    """NaN weights on one rank only before step ``at`` (once): that rank's loss is NaN,
    its NaN gradients reach every rank through DDP's all-reduce."""

    def __init__(self, rank: int, at: int) -> None:
        self.rank, self.at, self.done = rank, at, False

    def on_step_start(self, driver: Driver) -> None:
        if driver.backend.rank == self.rank and driver.step + 1 == self.at and not self.done:
            self.done = True
            with torch.no_grad():
                next(driver.backend.model.parameters()).fill_(float("nan"))


class SigtermOnRank(Callback):
    """This rank sends itself SIGTERM at the end of step ``at`` (before Preemption looks)."""

    priority = 40

    def __init__(self, rank: int, at: int) -> None:
        self.rank, self.at = rank, at

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.backend.rank == self.rank and driver.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


class RankScore(Callback):
    """A ``score`` that improves on rank 0 and stalls on rank 1 (ranks disagree)."""

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        metrics["score"] = 1.0 if driver.backend.rank == 1 else -float(driver.step)


def backend() -> Any:
    return GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        decay_steps=12,
        grad_clip=None,  # Fabric's clipping raises on NaN gradients by itself
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        eval_batches=2,
        seed=3,
    ).backend()


def params_of(driver: Driver) -> dict[str, Any]:
    flat = torch.cat([p.detach().flatten() for p in driver.backend.model.parameters()])
    return {
        "param_hash": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "params_finite": bool(torch.isfinite(flat).all()),
    }


def listing(root: Path) -> dict[str, Any]:
    latest = ckpt.latest(root)
    return {
        "checkpoints": [p.name for p in ckpt.list_checkpoints(root)],
        "latest": latest.name if latest else None,
        "temporaries": sorted(p.name for p in root.glob(f"{ckpt.TMP_PREFIX}*")),
    }


def run(name: str, out: Path, callbacks: list[Callback], **kwargs: Any) -> dict[str, Any]:
    """Fit one Driver; return this rank's view of it after every rank finished."""
    losses, logged = StepLosses(), LoggedLosses()
    driver = Driver(backend(), [*callbacks, losses, logged], run_dir=out / name, **kwargs)
    result = driver.fit()
    driver.backend.barrier()  # rank 0's last rotation is done before anyone lists
    return {
        "step": result.step,
        "stop_reason": result.stop_reason,
        "resumed_from": str(result.resumed_from) if result.resumed_from else None,
        "saved": [p.name for p in result.checkpoints],
        "losses": losses.as_list(),
        "logged": logged.logged,
        "callbacks": {
            type(cb).__name__: cb.state_dict() for cb in callbacks if cb.state_key is not None
        },
        **listing(driver.checkpoint_dir),
        **params_of(driver),
    }


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    seen: dict[str, Any] = {}
    seen["guard_stop"] = run(
        "guard_stop",
        out,
        [Checkpoint(every_n_steps=4), LossGuard(action="stop"), PoisonOnRank(1, 8)],
        max_steps=12,
        log_every=5,
    )
    seen["guard_rollback"] = run(
        "guard_rollback",
        out,
        [Checkpoint(every_n_steps=4), LossGuard(action="rollback"), PoisonOnRank(1, 8)],
        max_steps=12,
        log_every=5,
    )
    common = {"max_steps": 12, "log_every": 4}
    seen["uninterrupted"] = run(
        "uninterrupted",
        out,
        [Checkpoint(every_n_steps=3, keep_last=2, async_save=True), LossGuard()],
        **common,
    )
    # asynchronous saves: ranks agree a save is written at the log cadence, then finish it
    preempt = [Checkpoint(every_n_steps=3, keep_last=2, async_save=True), LossGuard(), Preemption()]
    seen["preempted"] = run("preempt", out, [*preempt, SigtermOnRank(1, 5)], **common)
    seen["resumed"] = run("preempt", out, preempt, resume="auto", **common)
    seen["early_stop"] = run(
        "early_stop",
        out,
        [
            ThroughputMonitor(),
            RankScore(),
            EarlyStopping("score", patience=2),
            Checkpoint(every_n_steps=5),
            CompositeLogger(["jsonl", "tensorboard", "console"]),
        ],
        max_steps=30,
        log_every=2,
        eval_every=4,
    )
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(seen, indent=1))


if __name__ == "__main__":
    main()
