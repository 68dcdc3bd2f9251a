"""Run under torchrun with 2 processes: a rollback under Fabric DDP replays bitwise.

``uninterrupted``: 8 steps straight. ``rollback``: checkpoints every 2 steps; at the
start of step 7 the run rolls back to the step-4 checkpoint and replays to step 8.
Each rank writes its final weights' hash and every logged loss to
``<out>/<mode>_rank<r>.json``.

The GPT has dropout (torch's random state, seeded differently on each rank when
training starts) and its shuffled loader draws its order from
its own ``torch.Generator``; Fabric re-makes it with a sampler per rank, so the data
position is counted and replayed on load.
"""

import hashlib
import json
import sys
from pathlib import Path

import torch

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint
from baton.core import Callback, Driver


class RollbackOnce(Callback):
    """At the start of step 7, roll back to the step-4 checkpoint (once)."""

    def __init__(self) -> None:
        self.done = False

    def on_step_start(self, driver):
        if driver.step == 6 and not self.done:
            self.done = True
            driver.rollback(driver.checkpoint_dir / "step_000004")


class SeedPerRank(Callback):
    """Each rank its own random stream (dropout masks differ between ranks): a restore
    must give every rank its own random state back, not rank 0's."""

    def on_train_start(self, driver):
        torch.manual_seed(100 + driver.backend.rank)


class RecordLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[tuple[int, float]] = []

    def on_log(self, driver, metrics):
        self.losses.append((driver.step, metrics["loss"]))


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    cfg = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32, dropout=0.1),
        batch_size=4,
        warmup_steps=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        seed=1,
    )
    backend = cfg.backend()
    losses = RecordLosses()
    callbacks: list[Callback] = [SeedPerRank(), losses]
    if mode == "rollback":
        callbacks += [Checkpoint(every_n_steps=2, keep_last=None), RollbackOnce()]
    result = Driver(backend, callbacks, max_steps=8, log_every=1, run_dir=out / mode).fit()
    params = torch.cat([p.detach().flatten() for p in backend.model.parameters()])
    (out / f"{mode}_rank{backend.rank}.json").write_text(
        json.dumps(
            {
                "step": result.step,
                "losses": losses.losses,
                "param_hash": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            }
        )
    )


if __name__ == "__main__":
    main()
