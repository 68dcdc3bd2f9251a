"""Gradient L2 norms per layer group, seen before clipping and the optimizer step.

Example::

    Driver(backend, callbacks=[GradientNormMonitor(depth=2)], log_every=10)
    # metrics["grad_norm/net.0"], metrics["grad_norm/net.2"], metrics["grad_norm/total"]

    GradientNormMonitor(depth=3)   # a model-spec run: grad_norm/model.layers.0, ...

The backend shows the gradients after backward and before clipping (the backend ability
``gradients``, on every backend); a backend without it is refused before the first step.
A parameter's group is the first ``depth`` parts of its name (``net.0.weight`` -> ``net``
at depth 1, ``net.0`` at depth 2); the names are the ``model_state`` names (Hugging Face
names for a model-spec run). Where the backend has the ``model_state`` ability the norms
are global: each rank sums the squares of the pieces it counts, and one
``sum_over_ranks`` adds them over every rank (the same numbers under tensor, pipeline,
FSDP or data parallelism). Norms are computed on the device only for steps that log,
and fetched with the other metrics in the log step's one transfer.

Metric keys logged: ``grad_norm/<group>`` for each group, ``grad_norm/total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from baton.callbacks.layer_groups import group_of, squares_by_group, total
from baton.core.backend import Ability, ShowsGradients
from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.model_state import HasModelState, ModelState
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import Driver


@CALLBACKS.register("gradient_norms")
class GradientNormMonitor(Callback):
    """Log ``grad_norm/<group>`` and ``grad_norm/total`` (L2, before clipping)."""

    priority = METRIC_PRIORITY

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self._driver: Driver | None = None
        self._state: ModelState | None = None
        self._counted: frozenset[str] | None = None
        self._logs_next = False

    def requires(self) -> frozenset[Ability]:
        return frozenset({"gradients"})

    def on_setup(self, driver: Driver) -> None:
        backend = driver.backend
        assert isinstance(backend, ShowsGradients)  # requires() was checked before on_setup
        self._driver = driver
        if "model_state" in driver.abilities and isinstance(backend, HasModelState):
            self._state = backend.model_state()
            self._counted = frozenset(p.name for p in self._state.parameters() if p.counted)
        backend.watch_gradients(self._watch)

    def on_step_start(self, driver: Driver) -> None:
        self._logs_next = (driver.step + 1) % driver.log_every == 0

    def group(self, name: str) -> str:
        return group_of(name, self.depth)

    def _watch(self, gradients: Mapping[str, Any]) -> None:
        if not self._logs_next or self._driver is None:
            return
        counted = self._counted
        squares = squares_by_group(
            gradients, self.depth, keep=lambda name: counted is None or name in counted
        )
        if self._state is not None:
            squares = self._state.sum_over_ranks(squares)
        if not squares:
            return
        for group, square in squares.items():
            self._driver.record(f"grad_norm/{group}", square**0.5)
        self._driver.record("grad_norm/total", total(squares.values()) ** 0.5)
