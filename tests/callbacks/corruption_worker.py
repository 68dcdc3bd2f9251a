"""Three CPU ranks under torchrun for the corruption test: a tiny Fabric DDP GPT on gloo.

Runs (one process group, each a new Driver), 8 steps with checkpoints every 2:
``plain_rollback`` is rolled back to step 4 before step 7; ``stop`` and ``rollback`` train
while a bit of one parameter flips on rank 2 before step 5, with
``CorruptionCheck(every_n_steps=2)``; ``optimizer`` flips a bit of that parameter's
Adam ``exp_avg`` instead (and stops); ``plain`` trains unhindered and ``replay`` with
``replay_every_n_steps=1`` too. Each rank writes ``<out>/rank<r>.json``: per run, the
findings, the steps replayed, the last step, the losses and a hash of its parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric import GPTConfig, GPTTraining
from baton.callbacks import Checkpoint, CorruptionCheck
from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt


class FlipBit(Callback):
    """Flip one bit of parameter ``name`` (or of its optimizer ``state``) on rank
    ``rank`` before step ``at`` (once)."""

    def __init__(self, rank: int, at: int, name: str, state: str | None = None) -> None:
        self.rank, self.at, self.name, self.done = rank, at, name, False
        self.state = state

    def on_step_start(self, driver: Driver) -> None:
        backend: Any = driver.backend
        if backend.rank != self.rank or driver.step + 1 != self.at or self.done:
            return
        self.done = True
        param = dict(backend.raw_model.named_parameters())[self.name]
        if self.state is not None:
            param = backend.optimizer.state[param][self.state]
        with torch.no_grad():
            param.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)


class RollBackOnce(Callback):
    """Roll back to step ``to`` before step ``at`` (once), as the check does: the same
    timeline without the corruption."""

    def __init__(self, at: int, to: int) -> None:
        self.at, self.to, self.done = at, to, False

    def on_step_start(self, driver: Driver) -> None:
        if driver.step + 1 == self.at and not self.done:
            self.done = True
            driver.rollback(driver.checkpoint_dir / ckpt.checkpoint_name(self.to))


def backend() -> Any:
    return GPTTraining(
        model=GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=16),
        batch_size=2,
        lr=3e-3,
        warmup_steps=2,
        decay_steps=8,
        accelerator="cpu",
        devices=3,
        strategy="ddp",
        seed=5,
    ).backend()


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step_end(self, driver: Driver, output: Any) -> None:
        self.losses.append(float(output.loss))


def run(out: Path, name: str, flipped: str) -> dict[str, Any]:
    check = CorruptionCheck(
        every_n_steps=2,
        action="rollback" if name == "rollback" else "stop",
        replay_every_n_steps=1 if name == "replay" else None,
    )
    losses = Losses()
    callbacks = [Checkpoint(every_n_steps=2, keep_last=None, save_on_stop=False), losses]
    if name == "plain_rollback":
        callbacks.append(RollBackOnce(at=7, to=4))
    elif name == "optimizer":
        callbacks += [check, FlipBit(rank=2, at=5, name=flipped, state="exp_avg")]
    elif name == "replay":
        callbacks.append(check)
    elif name != "plain":
        callbacks += [check, FlipBit(rank=2, at=5, name=flipped)]
    driver = Driver(backend(), callbacks, max_steps=8, log_every=2, run_dir=out / name)
    driver.fit()
    model: Any = driver.backend
    flat = torch.cat([p.detach().flatten() for p in model.raw_model.parameters()])
    return {
        "findings": check.findings,
        "replayed": check.replayed,
        "losses": losses.losses,
        "step": driver.step,
        "param_hash": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
    }


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    flipped = "blocks.0.mlp.0.weight"
    results: dict[str, Any] = {"flipped": flipped}
    for name in ("plain_rollback", "stop", "rollback", "optimizer", "plain", "replay"):
        results[name] = run(out, name, flipped)
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
