"""TensorBoard event files, written with the ``tensorboard`` package itself (no torch).

Example::

    CompositeLogger([TensorBoardSink()])   # <run_dir>/logs/tensorboard/events.out.tfevents.*
    # tensorboard --logdir runs/x/logs/tensorboard

Every metric becomes a scalar whose tag is its key (``loss``, ``eval/loss``, ...). The
recipe's settings are written once as hyperparameters (TensorBoard's HPARAMS tab). A
resumed run writes a purge marker at its first step (TensorBoard's ``purge_step``), so
events an earlier run logged after the resumed checkpoint are hidden, not doubled.
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
        from tensorboard.compat.proto import event_pb2  # pyright: ignore[reportMissingTypeStubs]
        from tensorboard.summary.writer.event_file_writer import (  # pyright: ignore[reportMissingTypeStubs]
            EventFileWriter,
        )

        if self.log_dir is None:
            self.log_dir = Path(driver.log_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir), flush_secs=self.flush_secs)
        if driver.settings:
            event: Any = cast(Any, event_pb2).Event
            for summary in hparams_summaries(driver.settings):
                self._writer.add_event(event(wall_time=time.time(), step=0, summary=summary))
        if getattr(driver, "resumed_from", None) is not None:
            self._purge_from(int(driver.step) + 1)

    def _purge_from(self, step: int) -> None:
        """TensorBoard drops earlier events at ``step`` and later when it reads this."""
        from tensorboard.compat.proto import event_pb2  # pyright: ignore[reportMissingTypeStubs]

        protos: Any = event_pb2
        log = protos.SessionLog(status=protos.SessionLog.START)
        self._writer.add_event(protos.Event(wall_time=time.time(), step=step, session_log=log))

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
