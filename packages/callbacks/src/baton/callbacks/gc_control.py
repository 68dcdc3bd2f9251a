"""Garbage-collection control: no automatic GC pauses, a full collection every N steps.

Example::

    Driver(backend, callbacks=[GarbageCollection(every_n_steps=500)])

Python's cyclic GC can pause a step at random; on many ranks one paused rank stalls
them all. This disables automatic collection for the run, collects every
``every_n_steps`` steps on every rank at once (a known step, the same everywhere),
and restores the previous GC setting at teardown.

Metric keys logged: ``gc/collect_s`` (seconds the last scheduled collection took).
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

from baton.core.callback import Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput


@CALLBACKS.register("gc")
class GarbageCollection(Callback):
    """Disable automatic GC during training; collect every ``every_n_steps`` steps.

    Args:
        every_n_steps: steps between collections (on every rank at the same step).
        generation: the generation collected (2: everything).
    """

    def __init__(self, every_n_steps: int = 1000, generation: int = 2) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if generation not in (0, 1, 2):
            raise ValueError(f"generation must be 0, 1 or 2, got {generation}")
        self.every_n_steps = every_n_steps
        self.generation = generation
        self.collections = 0
        self.last_collect_s: float | None = None
        self._was_enabled: bool | None = None

    def on_train_start(self, driver: DriverView) -> None:
        self._was_enabled = gc.isenabled()
        gc.collect(self.generation)
        gc.disable()

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if driver.step % self.every_n_steps == 0:
            start = time.perf_counter()
            gc.collect(self.generation)
            self.last_collect_s = time.perf_counter() - start
            self.collections += 1

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self.last_collect_s is not None:
            metrics["gc/collect_s"] = self.last_collect_s

    def on_teardown(self, driver: DriverView) -> None:
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
