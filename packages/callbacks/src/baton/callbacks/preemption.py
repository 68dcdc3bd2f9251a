"""Preemption: on SIGTERM or SIGUSR1, finish the current step, save, exit 0.

Example::

    from baton.callbacks import Checkpoint, Preemption

    Driver(backend, callbacks=[Checkpoint(every_n_steps=500), Preemption()],
           run_dir="runs/x", resume="auto")

A cluster scheduler (SLURM ``--signal=USR1@120``, Kubernetes, spot instances) sends
the signal; the handler only sets a flag, and after the step in flight the callback
asks the loop to save a checkpoint and stop, so ``baton run`` exits with status 0
and ``--resume auto`` continues exactly where it stopped. Inside a SLURM batch job
(``baton submit``), a signal in ``requeue_on`` (SLURM's time-limit warning) also
requeues the job once the checkpoint is complete (rank 0 runs ``scontrol requeue``);
the requeued job resumes from it. Handlers are installed at
train start (main thread only) and the previous ones restored at teardown. Under
several processes, ranks that did not get the signal agree at the next log step.

Metric keys logged: none.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from baton.core.callback import STOP_REQUEST_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput

log = logging.getLogger("baton")


@CALLBACKS.register("preemption")
class Preemption(Callback):
    """On SIGTERM/SIGUSR1: finish the step, save a checkpoint, stop cleanly (exit 0).

    Args:
        signals: signal names that stop the run with a checkpoint.
        requeue_on: those of them after which the SLURM job is requeued.
    """

    priority = STOP_REQUEST_PRIORITY

    def __init__(
        self,
        signals: Sequence[str] = ("SIGTERM", "SIGUSR1"),
        *,
        requeue_on: Sequence[str] = ("SIGUSR1",),
    ) -> None:
        unknown = [s for s in (*signals, *requeue_on) if not hasattr(signal, s)]
        if unknown:
            raise ValueError(f"unknown signal names {unknown}; use e.g. 'SIGTERM', 'SIGUSR1'")
        self.signals = [signal.Signals[s] for s in signals]
        self.requeue_on = set(requeue_on)
        self.received: str | None = None
        #: the signal that stopped this run, if one did
        self.stopped_by: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def on_train_start(self, driver: DriverView) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Preemption: not on the main thread, signal handlers not installed")
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
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
        self.stopped_by, self.received = self.received, None

    def on_train_end(self, driver: Any) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        if self.stopped_by not in self.requeue_on or not job or not driver.is_global_zero:
            return
        done = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            log.warning("requeued SLURM job %s; it resumes from the checkpoint just saved", job)
        else:
            log.error(
                "could not requeue SLURM job %s (%s); resubmit it to continue with --resume auto",
                job,
                done.stderr.strip() or f"scontrol exit {done.returncode}",
            )

    def on_teardown(self, driver: DriverView) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
