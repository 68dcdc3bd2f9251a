"""Fan out every logged metric to TensorBoard, W&B, MLflow, a JSONL file and the console.

Example::

    from baton.callbacks import CompositeLogger
    from baton.callbacks.sinks.wandb import WandbSink

    Driver(backend, callbacks=[
        CompositeLogger(["jsonl", "tensorboard", WandbSink(project="lm"), "console"]),
    ])

Sinks are given by name (``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``, ``console``)
or as objects. ``tensorboard``, ``wandb`` and ``mlflow`` need the
``baton-callbacks[tensorboard]`` / ``[wandb]`` / ``[mlflow]`` extras: naming one that is
not installed is an error that says so, and the default sinks leave TensorBoard out when
it is missing, with one log line saying how to add it. From the command line::

    baton run recipes/quickstart.py --callback logger:sinks=[jsonl,mlflow,console]
    baton run recipes/quickstart.py \
        --callback logger:sinks=[jsonl,mlflow],mlflow_tracking_uri=http://localhost:5000

A sink with state (MLflow's run id) has it kept in every checkpoint under the logger's
``state_key`` (``"logger"``, set only when such a sink is present), so a resumed run
continues the same MLflow run. Only rank 0 logs unless
``rank_zero_only=False``. A sink that fails (W&B unreachable, a full disk) is reported
once with a warning and training goes on; a sink that fails to open is dropped for the
run.

Sinks write on a background thread (``LogThread``): a log step only queues a copy of its
metrics, and the sinks get them in order. The queue is emptied when training ends, when
the run fails (``on_exception``) and on teardown, before the sinks close: when ``fit``
returns, or raises, everything logged is in the sinks' files. ``threaded=False`` writes
in the training thread instead.

Metric keys logged: whatever ``on_log`` carries (the backend's ``loss``, ``lr``,
``grad_norm``; the monitors' keys) with phase ``"train"``, and what ``on_eval_end``
carries (``eval/*``) with phase ``"eval"``, at ``driver.step``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from baton.callbacks.log_thread import LogThread
from baton.callbacks.sinks import (
    Phase,
    Sink,
    StatefulSink,
    build_sink,
    installed_sinks,
)
from baton.callbacks.sinks.console import ConsoleSink
from baton.core.callback import LOGGER_PRIORITY, Callback
from baton.core.errors import UsageError
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView

log = logging.getLogger("baton")

DEFAULT_SINKS = ("jsonl", "tensorboard", "console")


@CALLBACKS.register("logger")
class CompositeLogger(Callback):
    """Send training and evaluation metrics to several sinks, each tagged with its
    phase; a failing sink warns once, never stops.

    Args:
        sinks: sink names (jsonl, tensorboard, wandb, mlflow, console) or sink objects.
        rank_zero_only: only rank 0 logs.
        threaded: sinks write on a background thread.
        mlflow_tracking_uri: the ``mlflow`` sink's tracking URI (default:
            ``$MLFLOW_TRACKING_URI``, else a file store in ``<run_dir>/logs/mlflow``).
    """

    priority = LOGGER_PRIORITY

    def __init__(
        self,
        sinks: Sequence[str | Sink] = DEFAULT_SINKS,
        *,
        rank_zero_only: bool = True,
        threaded: bool = True,
        mlflow_tracking_uri: str | None = None,
    ) -> None:
        if sinks is DEFAULT_SINKS:  # the defaults leave out what is not installed
            sinks = installed_sinks(DEFAULT_SINKS)
        if mlflow_tracking_uri is not None and "mlflow" not in sinks:
            raise UsageError(
                "mlflow_tracking_uri is given but no mlflow sink: add it, "
                "e.g. --callback logger:sinks=[jsonl,mlflow],mlflow_tracking_uri=URI"
            )
        mlflow = {"tracking_uri": mlflow_tracking_uri}
        self.sinks: list[Sink] = [
            s if not isinstance(s, str) else build_sink(s, **(mlflow if s == "mlflow" else {}))
            for s in sinks
        ]
        self._stateful = [s for s in self.sinks if isinstance(s, StatefulSink)]
        # checkpoints hold the logger's state only where a sink has some
        self.state_key = "logger" if self._stateful else None
        self.rank_zero_only = rank_zero_only
        self.threaded = threaded
        self._active: list[Sink] = []
        self._thread: LogThread | None = None
        self._warned: set[str] = set()

    def state_dict(self) -> dict[str, Any]:
        return {sink.name: sink.state_dict() for sink in self._stateful}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for sink in self._stateful:
            if sink.name in state:
                sink.load_state_dict(state[sink.name])

    def console_keys(self) -> list[str] | None:
        """The console line's keys (``[]``: every metric; ``None``: no console sink)."""
        consoles = [s for s in self.sinks if isinstance(s, ConsoleSink)]
        if not consoles:
            return None
        return list(consoles[0].keys or [])

    def show_console_keys(self, keys: Sequence[str]) -> None:
        """Put these keys on the console line (``--console-keys``)."""
        for sink in self.sinks:
            if isinstance(sink, ConsoleSink):
                sink.keys = list(keys)

    def _warn_once(self, sink: Sink, what: str, error: BaseException) -> None:
        if sink.name not in self._warned:
            self._warned.add(sink.name)
            log.warning(
                "log sink %r failed to %s (%s: %s); training continues without it%s",
                sink.name,
                what,
                type(error).__name__,
                error,
                "" if what == "open" else " where it keeps failing",
            )

    def on_train_start(self, driver: DriverView) -> None:
        if self.rank_zero_only and not driver.is_global_zero:
            return
        for sink in self.sinks:
            try:
                sink.open(driver)
            except Exception as error:
                self._warn_once(sink, "open", error)
                continue
            self._active.append(sink)
        if self._active and self.threaded:
            self._thread = LogThread(self._write_all)

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._write(driver.step, metrics, "train")

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._write(driver.step, metrics, "eval")

    def _write(self, step: int, metrics: dict[str, float], phase: Phase) -> None:
        if not self._active:
            return
        if self._thread is not None:  # a copy: later callbacks may change the dict
            self._thread.submit(step, dict(metrics), phase)
        else:
            self._write_all(step, metrics, phase)

    def _write_all(self, step: int, metrics: dict[str, float], phase: Phase) -> None:
        for sink in self._active:
            try:
                sink.write(step, dict(metrics), phase)
            except Exception as error:
                self._warn_once(sink, "write", error)

    def flush(self) -> None:
        """Return once every metric logged so far has been handed to the sinks."""
        if self._thread is not None:
            self._thread.flush()

    def on_train_end(self, driver: DriverView) -> None:
        self.flush()  # before displays that finish after the loggers (exit hooks run last-first)

    def on_exception(self, driver: DriverView, error: BaseException) -> None:
        self.flush()

    def on_teardown(self, driver: DriverView) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None
        for sink in self._active:
            try:
                sink.close()
            except Exception as error:
                self._warn_once(sink, "close", error)
        self._active = []
