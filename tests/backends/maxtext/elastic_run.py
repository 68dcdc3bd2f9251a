"""One attempt of the tiny MaxText recipe on baton's byte stream, recording the windows
of the text every global batch read.

    python elastic_run.py OUT STOP_AT [recipe arguments ...]   (BATON_* for several processes)

Resumes the run directory's last checkpoint, saves and stops at step STOP_AT; the process
of rank r writes ``OUT.rank<r>``: {"windows": [...], "global_batch": B} in reading order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "maxtext_tiny.py"


class Recorded:
    """The stream's token array, noting the window of each row a batch reads."""

    def __init__(self, data: Any, seq_len: int, windows: list[int]) -> None:
        self.data, self.seq_len, self.windows = data, seq_len, windows

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, offsets: Any) -> Any:
        self.windows.extend(int(row[0]) // self.seq_len for row in offsets)
        return self.data[offsets]


class Record(Callback):
    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.windows: list[int] = []
        self.global_batch = 0

    def on_train_start(self, driver: Any) -> None:
        batches = driver.backend.batches
        self.global_batch = batches.batch_size
        batches.data = Recorded(batches.data, batches.seq_len, self.windows)

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.stop_at:
            driver.control.request_save("test", all_ranks=True)
            driver.control.request_stop("test", all_ranks=True)


def main() -> None:
    out, stop_at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    record = Record(stop_at)
    driver = build_driver(RECIPE, [*args, "--resume=auto"])
    assert driver is not None
    driver.callbacks.append(record)
    driver.fit()
    report = {"windows": record.windows, "global_batch": record.global_batch}
    Path(f"{out}.rank{driver.backend.rank}").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
