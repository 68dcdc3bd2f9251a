"""Run under torchrun with 2 processes: baton drives Fabric DDP on gloo.

Rank 1 alone asks to stop at step 3; with log_every=2 the flag is OR-reduced at
step 4, where both ranks stop together. Each rank writes what it saw to JSON.
"""

import hashlib
import json
import sys
from pathlib import Path

import torch

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.core import Callback, Driver


class StopOnRankOne(Callback):
    def on_step_end(self, driver, output):
        if driver.backend.rank == 1 and driver.step == 3:
            driver.control.request_stop("rank 1 asked")


def main() -> None:
    out = Path(sys.argv[1])
    cfg = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        seed=1,
    )
    backend = cfg.backend()
    driver = Driver(backend, [StopOnRankOne()], max_steps=20, log_every=2, run_dir=out / "run")
    result = driver.fit()
    params = torch.cat([p.detach().flatten() for p in backend.model.parameters()])
    (out / f"rank{backend.rank}.json").write_text(
        json.dumps(
            {
                "step": result.step,
                "reason": result.stop_reason,
                "world": backend.world_size,
                "param_sum": params.double().sum().item(),
                "param_hash": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            }
        )
    )


if __name__ == "__main__":
    main()
