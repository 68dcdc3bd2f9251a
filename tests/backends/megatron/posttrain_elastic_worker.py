"""One attempt of ``recipes/megatron_gpt_tiny.py`` (post-training) recording the packed
rows each data-parallel rank reads.

python posttrain_elastic_worker.py OUT STOP_AT RECIPE_ARGS...               (one rank)
torchrun --nproc-per-node 2 posttrain_elastic_worker.py OUT STOP_AT ...     (data parallel 2)

Resumes the run directory's last checkpoint, saves and stops at step STOP_AT; rank r
writes ``OUT.rank<r>``: the row indices its stream asked the dataset for, in order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "megatron_gpt_tiny.py"


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

    def on_train_start(self, driver: Any) -> None:
        for stream in driver.backend.train_streams:
            stream.dataset = Recorded(stream.dataset, self.read)

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.stop_at:
            driver.control.request_save("test", all_ranks=True)
            driver.control.request_stop("test", all_ranks=True)


def main() -> None:
    out, stop_at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    record = Record(stop_at)
    driver = build_driver(RECIPE, [*args, "--resume", "auto"])
    driver.callbacks.append(record)
    driver.fit()
    Path(f"{out}.rank{driver.backend.rank}").write_text(json.dumps(record.read))


if __name__ == "__main__":
    main()
