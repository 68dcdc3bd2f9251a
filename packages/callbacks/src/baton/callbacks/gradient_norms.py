"""Gradient L2 norms per layer group, seen before each optimizer step.

Example::

    Driver(backend, callbacks=[GradientNormMonitor(depth=2)], log_every=10)
    # metrics["grad_norm/net.0"], metrics["grad_norm/net.2"], metrics["grad_norm/total"]

The backend shows the gradients after backward and before clipping (the backend ability
``gradients``: ``FabricBackend``, ``LightningBackend``); a backend without it is refused
before the first step. A parameter's group is the first ``depth`` parts of its name
(``net.0.weight`` -> ``net`` at depth 1, ``net.0`` at depth 2). Norms are computed on
the device only for steps that log, and fetched with the other metrics in the log step's
one transfer.

Metric keys logged: ``grad_norm/<group>`` for each group, ``grad_norm/total``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from baton.core.backend import Ability, ShowsGradients
from baton.core.callback import METRIC_PRIORITY, Callback
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
        self._logs_next = False

    def requires(self) -> frozenset[Ability]:
        return frozenset({"gradients"})

    def on_setup(self, driver: Driver) -> None:
        backend = driver.backend
        assert isinstance(backend, ShowsGradients)  # requires() was checked before on_setup
        self._driver = driver
        backend.watch_gradients(self._watch)

    def on_step_start(self, driver: Driver) -> None:
        self._logs_next = (driver.step + 1) % driver.options.log_every == 0

    def group(self, name: str) -> str:
        return ".".join(name.split(".")[: self.depth])

    def _watch(self, gradients: Mapping[str, Any]) -> None:
        if not self._logs_next or self._driver is None or not gradients:
            return
        squares: dict[str, Any] = {}
        for name, grad in gradients.items():
            square = (grad * grad).sum()
            group = self.group(name)
            squares[group] = squares[group] + square if group in squares else square
        total: Any = 0.0
        for group, square in squares.items():
            self._driver.record(f"grad_norm/{group}", square**0.5)
            total = square + total
        self._driver.record("grad_norm/total", total**0.5)
