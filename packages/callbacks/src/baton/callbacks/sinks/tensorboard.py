"""TensorBoard event files: ``tensorboard``'s protos, framed with a C checksum (no torch).

Example::

    CompositeLogger([TensorBoardSink()])   # <run_dir>/logs/tensorboard/events.out.tfevents.*
    # tensorboard --logdir runs/x/logs/tensorboard

Every metric becomes a scalar whose tag is its key (``loss``, ``eval/loss``, ...). The
recipe's settings are written once as hyperparameters (TensorBoard's HPARAMS tab). A
resumed run writes a purge marker at its first step (TensorBoard's ``purge_step``), so
events an earlier run logged after the resumed checkpoint are hidden, not doubled.

Records are written by ``EventFile`` (TFRecord framing, checksums from the ``crc32c``
package in C), in the calling thread: ``CompositeLogger`` calls sinks from its own writer
thread, so the training loop does not wait for them. Each write reaches the file at once
unless ``flush_secs`` says how long it may wait in the buffer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.callbacks.sinks.event_file import EventFile
    from baton.core import DriverView


class TensorBoardSink:
    """Scalars to TensorBoard event files."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path | None = None, flush_secs: float = 0.0) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = flush_secs
        self._file: EventFile | None = None
        self._protos: Any = None  # tensorboard's event_pb2 and summary_pb2, once opened

    def open(self, driver: DriverView) -> None:
        from tensorboard.compat.proto import (  # pyright: ignore[reportMissingTypeStubs]
            event_pb2,
            summary_pb2,
        )

        from baton.callbacks.sinks.event_file import EventFile

        if self.log_dir is None:
            self.log_dir = Path(driver.log_dir) / "tensorboard"
        self._protos = (event_pb2, summary_pb2)
        self._file = EventFile(self.log_dir, flush_secs=self.flush_secs)
        if driver.options.settings:
            for summary in hparams_summaries(driver.options.settings):
                self._add(step=0, summary=summary)
        if driver.resumed_from is not None:
            self._purge_from(int(driver.step) + 1)

    def _add(self, **fields: Any) -> None:
        assert self._file is not None, "TensorBoardSink used before open"
        self._file.add_event(self._protos[0].Event(wall_time=time.time(), **fields))

    def _purge_from(self, step: int) -> None:
        """TensorBoard drops earlier events at ``step`` and later when it reads this."""
        SessionLog: Any = self._protos[0].SessionLog
        self._add(step=step, session_log=SessionLog(status=SessionLog.START))

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        Summary: Any = self._protos[1].Summary
        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._add(step=step, summary=Summary(value=values))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def hparams_summaries(settings: dict[str, Any]) -> list[Any]:
    """The experiment and session-start summaries of TensorBoard's hparams plugin for
    ``settings`` (numbers, booleans and strings; anything else as its string)."""
    import importlib

    # generated protobuf modules: no stubs, so they are typed as Any here
    struct_pb2: Any = importlib.import_module("google.protobuf.struct_pb2")
    summary_pb2: Any = importlib.import_module("tensorboard.compat.proto.summary_pb2")
    api_pb2: Any = importlib.import_module("tensorboard.plugins.hparams.api_pb2")
    plugin_data_pb2: Any = importlib.import_module("tensorboard.plugins.hparams.plugin_data_pb2")
    Summary, SummaryMetadata = summary_pb2.Summary, summary_pb2.SummaryMetadata

    values: dict[str, Any] = {}
    for key, raw in settings.items():
        value = struct_pb2.Value()
        if isinstance(raw, bool):
            value.bool_value = raw
        elif isinstance(raw, int | float):
            value.number_value = float(raw)
        else:
            value.string_value = "None" if raw is None else str(raw)
        values[key] = value

    def summary(tag: str, data: Any) -> Any:
        metadata = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(
                plugin_name="hparams", content=data.SerializeToString()
            )
        )
        return Summary(value=[Summary.Value(tag=tag, metadata=metadata)])

    experiment = plugin_data_pb2.HParamsPluginData(
        version=0,
        experiment=api_pb2.Experiment(hparam_infos=[api_pb2.HParamInfo(name=k) for k in values]),
    )
    start = plugin_data_pb2.HParamsPluginData(
        version=0, session_start_info=plugin_data_pb2.SessionStartInfo(hparams=values)
    )
    return [
        summary("_hparams_/experiment", experiment),
        summary("_hparams_/session_start_info", start),
    ]
