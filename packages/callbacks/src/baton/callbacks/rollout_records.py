"""Write every rollout of a run that trains on rollouts to ``RUN_DIR/logs/rollouts.jsonl``.

One JSON object per completion, appended as each batch of rollouts is sampled (rank 0
writes): the step that first trains on it, its index among the step's rollouts, the
prompt's index and ids, the completion's ids and text, each reward function's value
(``null``: it could not score the completion), the weighted reward, the advantage the loss
used, the sampling log-probability of each completion token and their sum, and whether
the completion was truncated::

    {"step": 3, "index": 0, "prompt_index": 41, "prompt_ids": [...], "completion_ids": [...],
     "completion": "<answer>7</answer>", "rewards": {"accuracy": 1.0}, "reward": 1.0,
     "advantage": 0.87, "logp_sum": -12.3, "logps": [...], "truncated": false}

A resumed run continues the file: records of steps after the checkpoint's (written by
the run that was killed) are dropped first, so no rollout appears twice; a rollback
drops those past the step it returns to the same way.

Example::

    from baton.callbacks.rollout_records import RolloutRecords

    Driver(backend, [RolloutRecords()], rollouts=phase, run_dir="runs/grpo")
    # or on the command line: --callback rollout_records
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from baton.callbacks.sinks.jsonl import drop_rows_after
from baton.core.callback import LOGGER_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView
    from baton.core.rollouts.collaborator import RolloutRecord

FILE_NAME = "rollouts.jsonl"


@CALLBACKS.register("rollout_records")
class RolloutRecords(Callback):
    """Append one JSON line per rollout to ``rollouts.jsonl`` (rank 0).

    Args:
        path: the file to write; by default ``RUN_DIR/logs/rollouts.jsonl``.
    """

    priority = LOGGER_PRIORITY

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._fh: IO[str] | None = None
        #: records written by this process
        self.written = 0

    def _open(self, driver: DriverView) -> None:
        """Open the file for appending, without the records of steps after the current."""
        self._close()
        if self.path is None:
            self.path = Path(driver.log_dir) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            drop_rows_after(self.path, int(driver.step))
        self._fh = open(self.path, "a", encoding="utf-8")

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def on_train_start(self, driver: DriverView) -> None:
        if driver.is_global_zero:
            self._open(driver)

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        if self._fh is not None:  # a rollback in the middle of the run
            self._open(driver)

    def on_rollout_end(self, driver: DriverView, rollouts: Sequence[RolloutRecord]) -> None:
        if self._fh is None:
            return
        self._fh.write("".join(json.dumps(record.to_json()) + "\n" for record in rollouts))
        self._fh.flush()
        self.written += len(rollouts)

    def on_train_end(self, driver: DriverView) -> None:
        self._close()

    def on_teardown(self, driver: DriverView) -> None:
        self._close()


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``rollouts.jsonl`` file in order (a torn last line is left out)."""
    records: list[dict[str, Any]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
