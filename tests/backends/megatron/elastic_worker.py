"""One attempt of a tiny Megatron-Core run on prepared data, recording the global samples
each data-parallel rank reads.

python elastic_worker.py OUT STOP_AT RUN_DIR PREFIX TOKENIZER TRAIN_SAMPLES   (one rank)
torchrun --nproc-per-node 2 elastic_worker.py ...                             (data parallel 2)

Resumes RUN_DIR's last checkpoint, saves and stops at step STOP_AT (global batch 8,
micro-batches of 2); rank r writes ``OUT.rank<r>``: the indices of the training split its
stream asked for, in order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.backends.megatron import MegatronBackend, MegatronConfig
from baton.backends.megatron.config import tiny_transformer_config
from baton.core import Callback, Driver


class Recorded:
    """A dataset that notes every index read."""

    def __init__(self, dataset: Any, read: list[int]) -> None:
        self.dataset, self.read = dataset, read

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.read.append(int(index))
        return self.dataset[index]


class Record(Callback):
    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.read: list[int] = []

    def on_train_start(self, driver: Driver) -> None:
        for stream in driver.backend.train_streams:  # type: ignore[attr-defined]
            stream.dataset = Recorded(stream.dataset, self.read)

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == self.stop_at:
            driver.control.request_save("test", all_ranks=True)
            driver.control.request_stop("test", all_ranks=True)


def main() -> None:
    out, stop_at, run_dir, prefix, tokenizer, samples = sys.argv[1:7]
    config = MegatronConfig(
        model=tiny_transformer_config(),
        micro_batch_size=2,
        global_batch_size=8,
        warmup_steps=1,
        decay_steps=20,
    )
    config.data.data_path, config.data.tokenizer = prefix, tokenizer
    config.data.train_samples = int(samples)
    record = Record(int(stop_at))
    driver = Driver(
        MegatronBackend(config),
        [record],
        max_steps=100,
        log_every=1,
        run_dir=run_dir,
        resume="auto",
    )
    driver.fit()
    Path(f"{out}.rank{driver.backend.rank}").write_text(json.dumps(record.read))


if __name__ == "__main__":
    main()
