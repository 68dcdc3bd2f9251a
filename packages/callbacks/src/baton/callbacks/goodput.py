"""Goodput: where every second of a run's wall time goes, across restarts and requeues.

Example::

    from baton.callbacks import Goodput

    Driver(backend, callbacks=[Goodput(interval_s=30)], run_dir="runs/x", resume="auto")
    # later, after any number of kills and resumes:
    #   baton goodput runs/x     -> the table, and runs/x/plots/goodput.png

Rank 0 appends one line per ``interval_s`` to ``RUN_DIR/goodput.jsonl`` (flushed and
fsynced) and, after every step, rewrites the interval in progress in place in
``RUN_DIR/goodput.mark`` (one ``pwrite``, no fsync: about 10 µs). A SIGKILL loses
neither: the next attempt (or ``baton goodput``) reads the mark, so the steps a killed
attempt completed after its last line count as its own, and exactly those redone by the
next attempt count as ``redone``. A small watcher process
(``baton.callbacks.goodput_exit``) adds the time from the mark's last record to the
process's real end to ``shutdown``: the interpreter's exit after the last line (seconds
of module teardown with torch loaded), or the unfinished step a kill cut short. Only
what a machine crash takes counts as ``between_attempts``. The categories (``baton.callbacks.goodput_ledger.CATEGORIES``):

- ``startup``: from the process's start (read from ``/proc``, so interpreter start and
  imports count) to ``on_setup``, plus each attempt's first step (compilation, warm-up);
- ``restore``: ``on_setup`` to ``on_train_start`` (checkpoint load, run record);
- ``productive``: steps whose number no earlier attempt completed, less the time they
  waited for data, evaluation and checkpoint blocking (``driver.eval_time_s``,
  ``driver.save_blocking_s``);
- ``data_waiting``: the time those steps waited for their batches, as the backend
  reports it (``StepOutput.data_wait_s``: Fabric, Lightning, JAX, Megatron-Core, MaxText
  and TorchTitan time their fetch; a backend that does not leaves it in ``productive``);
- ``redone``: steps whose number an earlier attempt (or a rollback) had completed,
  each counted once as badput;
- ``evaluation``, ``checkpoint``: the driver's evaluation time and save blocking time;
- ``shutdown``: from the last step to the process's end (final saves, error handling,
  teardown, the interpreter's exit; after a kill, the step it cut short);
- ``between_attempts``: from an attempt's process end to the next attempt's process
  start.

Within an attempt the categories tile its time exactly, so over the run they add up to
the wall time from the first process start to the last line. A redone step or an
attempt's first step stays whole in ``redone`` or ``startup``, its data wait included.

Metric keys logged: ``goodput`` (productive seconds over wall seconds so far, all
attempts included).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.callbacks.goodput_exit import watch_exit
from baton.callbacks.goodput_ledger import (
    CATEGORIES,
    LedgerWriter,
    StepMark,
    read_ledger_lines,
    summarise,
    unwritten_mark,
)
from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput

#: when this module was imported: the process start where ``/proc`` cannot say
_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """Wall-clock time (``time.time()`` scale) at which this process started: from
    ``/proc/self/stat`` (clock ticks since boot) and ``/proc/uptime``; where there is no
    ``/proc``, the time this module was imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return _IMPORTED_AT
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    started_after_boot = int(fields[19]) / ticks  # field 22 of proc(5): starttime
    return time.time() - uptime + started_after_boot


@CALLBACKS.register("goodput")
class Goodput(Callback):
    """Attribute every second of the run's wall time; log the running ``goodput``.

    Args:
        interval_s: seconds between ledger lines (a kill loses at most this much
            attribution; 0 writes after every step).
    """

    priority = METRIC_PRIORITY

    def __init__(self, interval_s: float = 10.0) -> None:
        """``interval_s``: how often a line is written (a kill loses at most this much
        attribution; 0 writes after every step)."""
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self.attempt = ""
        self._writer: LedgerWriter | None = None
        self._step_mark: StepMark | None = None
        self._pending: dict[str, float] = {}
        self._steps = {"new": 0, "redone": 0}
        self._mark = 0.0  # wall time up to which time is attributed
        self._t0 = 0.0  # start of the interval not yet written
        self._flushed_at = 0.0
        self._eval0 = 0.0
        self._save0 = 0.0
        self._done = 0  # the highest step number any attempt completed
        self._first_step = True
        self._run_start = 0.0
        self._productive_before = 0.0
        self._productive = 0.0

    # -- lifecycle -------------------------------------------------------------
    def on_setup(self, driver: DriverView) -> None:
        if not driver.is_global_zero:
            return
        run_dir = Path(driver.options.run_dir)
        self._writer = LedgerWriter(run_dir)
        lines = read_ledger_lines(run_dir)
        recovered = unwritten_mark(run_dir, lines)  # what a killed attempt did last
        if recovered is not None:
            self._writer.append(recovered)
            lines.append(recovered)
        self._step_mark = StepMark(run_dir)
        watch_exit(self._step_mark.path)
        before = summarise(lines)
        self._done = max((a.last_step for a in before.attempts), default=0)
        self._productive_before = before.seconds["productive"]
        started = process_start_time()
        self._run_start = before.attempts[0].t0 if before.attempts else started
        self.attempt = f"{socket.gethostname()}:{os.getpid()}@{started:.2f}"
        now = time.time()
        self._t0 = started
        self._mark = now
        self._pending = {"startup": now - started}
        self._write(driver, now, process_start=started)

    def on_train_start(self, driver: DriverView) -> None:
        if self._writer is None:
            return
        now = self._advance("restore")
        self._done = max(self._done, driver.step)
        self._eval0, self._save0 = driver.eval_time_s, driver.save_blocking_s
        self._write(driver, now)

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if self._writer is None:
            return
        now = time.time()
        elapsed = now - self._mark
        paused = self._take_pauses(driver)
        step_time = max(elapsed - paused, 0.0)
        new = driver.step > self._done
        self._steps["new" if new else "redone"] += 1
        if self._first_step:
            category = "startup"
            self._first_step = False
        else:
            category = "productive" if new else "redone"
        if category == "productive" and output.data_wait_s:
            waited = min(output.data_wait_s, step_time)
            self._add("data_waiting", waited)
            step_time -= waited
        self._add(category, step_time)
        if category == "productive":
            self._productive += step_time
        self._mark = now
        self._done = max(self._done, driver.step)
        if now - self._flushed_at >= self.interval_s:
            self._write(driver, now)
        elif self._step_mark is not None:
            self._step_mark.write(self._record(driver.step))

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self._writer is None:
            return
        wall = time.time() - self._run_start
        if wall > 0:
            metrics["goodput"] = (self._productive_before + self._productive) / wall

    def on_teardown(self, driver: DriverView) -> None:
        if self._writer is None:
            return
        now = time.time()
        paused = self._take_pauses(driver)
        self._add("shutdown", max(now - self._mark - paused, 0.0))
        self._mark = now
        self._write(driver, now)
        self._writer.close()
        self._writer = None

    # -- bookkeeping -----------------------------------------------------------
    def _take_pauses(self, driver: DriverView) -> float:
        """Move the evaluation and save blocking time since the last call to their
        categories; returns their sum."""
        evaluation = driver.eval_time_s - self._eval0
        saving = driver.save_blocking_s - self._save0
        self._eval0, self._save0 = driver.eval_time_s, driver.save_blocking_s
        self._add("evaluation", evaluation)
        self._add("checkpoint", saving)
        return evaluation + saving

    def _add(self, category: str, seconds: float) -> None:
        if seconds:
            self._pending[category] = self._pending.get(category, 0.0) + seconds

    def _advance(self, category: str) -> float:
        now = time.time()
        self._add(category, now - self._mark)
        self._mark = now
        return now

    def _record(self, step: int, **extra: Any) -> dict[str, Any]:
        """The interval not yet written: a ledger line, or the step mark's content."""
        return {
            "attempt": self.attempt,
            "t0": self._t0,
            "t1": self._mark,
            "step": step,
            "seconds": {k: round(v, 6) for k, v in self._pending.items() if k in CATEGORIES},
            "steps": dict(self._steps),
            **extra,
        }

    def _write(self, driver: DriverView, now: float, **extra: Any) -> None:
        assert self._writer is not None
        self._writer.append(self._record(driver.step, **extra))
        self._t0 = self._mark
        self._flushed_at = now
        self._pending = {}
        self._steps = {"new": 0, "redone": 0}
        if self._step_mark is not None:  # the next interval, empty so far
            self._step_mark.write(self._record(driver.step))
