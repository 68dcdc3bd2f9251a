"""TensorBoard event files, written with the ``tensorboard`` package itself (no torch).

Example::

    CompositeLogger([TensorBoardSink()])   # <run_dir>/logs/tensorboard/events.out.tfevents.*
    # tensorboard --logdir runs/x/logs/tensorboard

Every metric becomes a scalar whose tag is its key (``loss``, ``eval/loss``, ...).
A resumed run writes a purge marker at its first step (TensorBoard's ``purge_step``),
so events an earlier run logged after the resumed checkpoint are hidden, not doubled.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class TensorBoardSink:
    """Scalars to TensorBoard event files."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path | None = None, flush_secs: int = 30) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = flush_secs
        self._writer: Any = None

    def open(self, driver: Any) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        if self.log_dir is None:
            self.log_dir = Path(driver.log_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir), flush_secs=self.flush_secs)
        if getattr(driver, "resumed_from", None) is not None:
            self._purge_from(int(driver.step) + 1)

    def _purge_from(self, step: int) -> None:
        """TensorBoard drops earlier events at ``step`` and later when it reads this."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._writer.add_event(
            Event(wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START))
        )

    def write(self, step: int, metrics: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._writer.add_event(
            Event(wall_time=time.time(), step=step, summary=Summary(value=values))
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
