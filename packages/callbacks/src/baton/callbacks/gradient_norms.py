"""Gradient L2 norms per layer group, seen before clipping and the optimizer step.

Example::

    Driver(backend, callbacks=[GradientNormMonitor(depth=2)], log_every=10)
    # metrics["grad_norm/net.0"], metrics["grad_norm/net.2"], metrics["grad_norm/total"]

    GradientNormMonitor(depth=3)   # a model-spec run: grad_norm/model.layers.0, ...

The backend shows the gradients after backward and before clipping through its
``model_state`` ability (``ModelState.watch_gradients``, on every backend); a backend
without it is refused before the first step. A parameter's group is the first ``depth``
parts of its name (``net.0.weight`` -> ``net`` at depth 1, ``net.0`` at depth 2; Hugging
Face names for a model-spec run: ``model.layers.0`` at depth 3). The norms are global:
each rank sums the squares of the pieces it counts, and one ``sum_over_ranks`` adds them
over every rank (the same numbers under tensor, pipeline, FSDP or data parallelism).
Norms are computed on the device only for steps that log, and fetched with the other
metrics in the log step's one transfer.

Metric keys logged: ``grad_norm/<group>`` for each group, ``grad_norm/total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from baton.callbacks.layer_groups import group_of, squares_by_group, total
from baton.core.abilities import Ability
from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.model_state import ModelState
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView


@CALLBACKS.register("gradient_norms")
class GradientNormMonitor(Callback):
    """Log ``grad_norm/<group>`` and ``grad_norm/total`` (L2, before clipping).

    Args:
        depth: name parts that make a parameter's group (net.0.weight: net at 1,
            net.0 at 2).
    """

    priority = METRIC_PRIORITY

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self._driver: DriverView | None = None
        self._state: ModelState | None = None
        self._counted: frozenset[str] = frozenset()
        self._logs_next = False

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})

    def on_setup(self, driver: DriverView) -> None:
        self._driver = driver
        self._state = driver.backend.model_state()
        self._counted = frozenset(p.name for p in self._state.parameters() if p.counted)
        self._state.watch_gradients(self._watch)

    def on_step_start(self, driver: DriverView) -> None:
        self._logs_next = (driver.step + 1) % driver.options.log_every == 0

    def group(self, name: str) -> str:
        return group_of(name, self.depth)

    def _watch(self, gradients: Mapping[str, Any]) -> None:
        if not self._logs_next or self._driver is None or self._state is None:
            return
        squares = squares_by_group(gradients, self.depth, keep=self._counted.__contains__)
        squares = self._state.sum_over_ranks(squares)
        if not squares:
            return
        for group, square in squares.items():
            self._driver.record(f"grad_norm/{group}", square**0.5)
        self._driver.record("grad_norm/total", total(squares.values()) ** 0.5)
