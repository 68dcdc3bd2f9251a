"""Stop (and save) before a wall-clock budget for this process runs out.

Example::

    from baton.callbacks import TimeLimit

    # a 4-hour job allocation: stop with a checkpoint after 3 h 50 min of this process
    Driver(backend, callbacks=[TimeLimit(minutes=230)], max_steps=100_000)

Unlike the driver's ``max_time_s`` (training time summed over every resume of a
run), this counts the wall time of the current process from the callback's
creation, setup included: the budget of a scheduler's allocation. The stop saves a
checkpoint when ``save=True`` (the default), so ``--resume auto`` continues.

Metric keys logged: ``time/elapsed_min`` (minutes used of this process's budget).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from baton.core.callback import STOP_REQUEST_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput

log = logging.getLogger("baton")


@CALLBACKS.register("time_limit")
class TimeLimit(Callback):
    """Stop with a checkpoint once this process has run ``minutes`` of wall time.

    Args:
        minutes: wall time after which the run stops.
        save: write a checkpoint when it stops.
    """

    priority = STOP_REQUEST_PRIORITY

    def __init__(self, minutes: float, *, save: bool = True) -> None:
        if minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {minutes}")
        self.minutes = minutes
        self.save = save
        self._start = time.monotonic()
        self._fired = False

    def elapsed_min(self) -> float:
        return (time.monotonic() - self._start) / 60

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if self._fired or self.elapsed_min() < self.minutes:
            return
        self._fired = True
        reason = f"time limit of {self.minutes:g} min reached"
        driver.control.request_stop(reason)
        driver.control.request_log(reason)
        if self.save:
            driver.control.request_save(reason)

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        metrics["time/elapsed_min"] = self.elapsed_min()
