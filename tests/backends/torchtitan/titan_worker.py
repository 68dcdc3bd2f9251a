"""Runs of the TorchTitan backend shared by the tests, in-process or as a script.

python titan_worker.py resume RUN_DIR OUT.json       # resume RUN_DIR, record losses
torchrun --nproc-per-node 2 titan_worker.py ranks OUT_DIR   # 2 CPU ranks, FSDP
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from baton.backends.torchtitan import TorchTitanBackend
from baton.backends.torchtitan.configs import llama3_debug
from baton.core import Callback, Driver

STEPS = 10
SAVE_AT = 5
SEQ_LEN = 64
BATCH = 2


def small_config(dump_folder: str, steps: int = STEPS) -> Any:
    """The debug model on local text, small batches: the config every test uses."""
    return llama3_debug(
        steps=steps, seq_len=SEQ_LEN, local_batch_size=BATCH, seed=0, dump_folder=dump_folder
    )


class RecordLosses(Callback):
    """Keeps every logged loss by step; asks for a save at ``save_at``."""

    def __init__(self, save_at: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.save_at = save_at

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == self.save_at:
            driver.control.request_save("test save", all_ranks=True)

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        if "loss" in metrics:
            self.losses[driver.step] = metrics["loss"]


def baton_run(
    run_dir: Path, *, save_at: int | None = None, resume: str = "none", log_every: int = 1
) -> tuple[dict[int, float], Driver]:
    record = RecordLosses(save_at)
    backend = TorchTitanBackend(small_config(str(run_dir / "torchtitan")))
    driver = Driver(
        backend, [record], max_steps=STEPS, log_every=log_every, run_dir=run_dir, resume=resume
    )
    driver.fit()
    return record.losses, driver


class StopOnRankZero(Callback):
    """Rank 0 alone asks to stop at step 3: every rank must stop together at step 4."""

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == 3 and driver.backend.rank == 0:
            driver.control.request_stop("rank 0 says stop")


def ranks_run(out_dir: Path) -> None:
    record = RecordLosses()
    config = small_config(str(out_dir / "torchtitan"), steps=8)
    config.parallelism.data_parallel_replicate_degree = 2  # DDP over the 2 CPU ranks
    config.parallelism.data_parallel_shard_degree = 1
    # the default "spmd_types" path rejects the plain-tensor parameters FSDP sees here
    config.parallelism.spmd_backend = "partial_dtensor"
    backend = TorchTitanBackend(config)
    driver = Driver(
        backend, [record, StopOnRankZero()], max_steps=8, log_every=2, run_dir=out_dir / "run"
    )
    result = driver.fit()
    rank = int(os.environ["RANK"])  # the process group is gone after teardown
    facts = {
        "losses": record.losses,
        "step": result.step,
        "stop_reason": result.stop_reason,
        "tokens": result.tokens,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "resume":
        losses, driver = baton_run(Path(sys.argv[2]), resume="auto")
        facts = {"losses": losses, "resumed_from": str(driver.resumed_from)}
        Path(sys.argv[3]).write_text(json.dumps(facts))
    elif mode == "ranks":
        ranks_run(Path(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
