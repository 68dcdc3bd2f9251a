"""Preemption: on SIGTERM or SIGUSR1, finish the current step, save, exit 0.

Example::

    from baton.callbacks import Checkpoint, Preemption

    Driver(backend, callbacks=[Checkpoint(every_n_steps=500), Preemption()],
           run_dir="runs/x", resume="auto")

A cluster scheduler (SLURM ``--signal=USR1@120``, Kubernetes, spot instances) sends
the signal; the handler only sets a flag, and after the step in flight the callback
asks the loop to save a checkpoint and stop, so ``baton run`` exits with status 0
and ``--resume auto`` continues exactly where it stopped. Handlers are installed at
train start (main thread only) and the previous ones restored at teardown. Under
several processes, ranks that did not get the signal agree at the next log step.

Metric keys logged: none.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from baton.core.callback import STOP_REQUEST_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import Driver, StepOutput

log = logging.getLogger("baton")


@CALLBACKS.register("preemption")
class Preemption(Callback):
    """On SIGTERM/SIGUSR1: finish the step, save a checkpoint, stop cleanly (exit 0)."""

    priority = STOP_REQUEST_PRIORITY

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1")) -> None:
        unknown = [s for s in signals if not hasattr(signal, s)]
        if unknown:
            raise ValueError(f"unknown signal names {unknown}; use e.g. 'SIGTERM', 'SIGUSR1'")
        self.signals = [signal.Signals[s] for s in signals]
        self.received: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def on_train_start(self, driver: Driver) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Preemption: not on the main thread, signal handlers not installed")
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def on_step_end(self, driver: Driver, output: StepOutput) -> None:
        if self.received is None:
            return
        reason = f"received {self.received} (preemption)"
        log.warning(
            "%s at step %d: saving a checkpoint and stopping; resume with --resume auto",
            self.received,
            driver.step,
        )
        driver.control.request_save(reason)
        driver.control.request_stop(reason)
        driver.control.request_log(reason)
        self.received = None

    def on_teardown(self, driver: Driver) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
