"""TensorBoard event files, written with the ``tensorboard`` package itself (no torch).

Example::

    CompositeLogger([TensorBoardSink()])   # <run_dir>/logs/tensorboard/events.out.tfevents.*
    # tensorboard --logdir runs/x/logs/tensorboard

Every metric becomes a scalar whose tag is its key (``loss``, ``eval/loss``, ...).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import Driver


class TensorBoardSink:
    """Scalars to TensorBoard event files."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path | None = None, flush_secs: int = 30) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = flush_secs
        self._writer: Any = None

    def open(self, driver: Driver) -> None:
        from tensorboard.summary.writer.event_file_writer import (  # pyright: ignore[reportMissingTypeStubs]
            EventFileWriter,
        )

        if self.log_dir is None:
            self.log_dir = Path(driver.log_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir), flush_secs=self.flush_secs)

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        from tensorboard.compat.proto import (  # pyright: ignore[reportMissingTypeStubs]
            event_pb2,
            summary_pb2,
        )

        # generated protobuf modules declare their classes only at run time
        Event: Any = cast(Any, event_pb2).Event
        Summary: Any = cast(Any, summary_pb2).Summary
        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._writer.add_event(
            Event(wall_time=time.time(), step=step, summary=Summary(value=values))
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
