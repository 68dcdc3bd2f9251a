"""One attempt of the quickstart (or of ``--recipe PATH``) on prepared data, recording
the samples each rank reads.

python elastic_worker.py OUT STOP_AT QUICKSTART_ARGS...        (one rank)
torchrun --nproc-per-node 2 elastic_worker.py OUT STOP_AT ...  (two ranks)
python elastic_worker.py OUT STOP_AT --recipe recipes/hf_finetune.py RECIPE_ARGS...

Trains (resuming the run directory's last checkpoint), saves and stops at step STOP_AT;
rank r writes ``OUT.rank<r>``: {"samples": N, "read": [[epoch, sample index], ...]} in
the order it read them (the indices the stream asked its dataset for).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

QUICKSTART = Path(__file__).resolve().parents[3] / "recipes" / "quickstart.py"


class Recorded:
    """A dataset that notes every index read, with the epoch of the batches reading it."""

    def __init__(self, dataset: Any, batches: Any, read: list[list[int]]) -> None:
        self.dataset, self.batches, self.read = dataset, batches, read

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.read.append([self.batches.epoch, int(index)])
        return self.dataset[index]


class Record(Callback):
    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.read: list[list[int]] = []
        self.samples = 0

    def on_train_start(self, driver: Any) -> None:
        batches = driver.backend.stream.data
        self.samples = len(batches.dataset)
        batches.dataset = Recorded(batches.dataset, batches, self.read)

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.stop_at:
            driver.control.request_save("test", all_ranks=True)
            driver.control.request_stop("test", all_ranks=True)


def main() -> None:
    out, stop_at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    recipe = QUICKSTART
    if args[:1] == ["--recipe"]:
        recipe, args = Path(args[1]), args[2:]
    record = Record(stop_at)
    driver = build_driver(recipe, [*args, "--resume", "auto"])
    assert driver is not None
    driver.callbacks.append(record)
    driver.fit()
    result = {"samples": record.samples, "read": record.read}
    Path(f"{out}.rank{driver.backend.rank}").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
