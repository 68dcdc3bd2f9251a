"""Weight norms and update-to-weight ratios per layer group, on log steps.

Example::

    Driver(backend, callbacks=[WeightMonitor(depth=3)], log_every=10)
    # metrics["weight_norm/model.layers.0"], metrics["update_ratio/model.layers.0"], ...

On a step that logs, the callback copies the weights it counts before the step (on the
device) and, after the step, computes per group the L2 norm of the weights and the ratio
``||w_after - w_before|| / ||w_after||`` (how far one update moved the layer; a ratio
near 1e-3 is the classic healthy range for Adam). Squares are summed over the pieces each
rank counts and over ranks with the backend's ``sum_over_ranks``: global numbers under
any parallel layout. Steps that do not log cost nothing; a logging step holds one extra
copy of the weights during the step. A parameter's group is the first ``depth`` parts
of its name (the ``model_state`` names: Hugging Face names for a model-spec run).

Metric keys logged: ``weight_norm/<group>``, ``update_ratio/<group>``,
``weight_norm/total``, ``update_ratio/total``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace

from baton.callbacks.layer_groups import squares_by_group, total
from baton.core.abilities import Ability
from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.metrics import StepOutput
from baton.core.model_state import ModelState
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView


@CALLBACKS.register("weight_monitor")
class WeightMonitor(Callback):
    """Log ``weight_norm/<group>`` and ``update_ratio/<group>`` on log steps.

    Args:
        depth: name parts that make a group (``model.layers`` at 2, ``model.layers.0`` at 3).
    """

    priority = METRIC_PRIORITY

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self._state: ModelState | None = None
        self._before: dict[str, Any] | None = None

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})

    def on_setup(self, driver: DriverView) -> None:
        self._state = driver.backend.model_state()

    def _counted(self) -> dict[str, Any]:
        assert self._state is not None
        return {p.name: p.value for p in self._state.parameters() if p.counted}

    def on_step_start(self, driver: DriverView) -> None:
        if (driver.step + 1) % driver.options.log_every:
            return
        self._before = {
            name: array_namespace(value).asarray(value, copy=True)
            for name, value in self._counted().items()
        }

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if self._before is None or self._state is None:
            return
        before, self._before = self._before, None
        after = self._counted()
        weights = squares_by_group(after, self.depth)
        moved = squares_by_group(
            {name: after[name] - before[name] for name in after if name in before}, self.depth
        )
        sums = self._state.sum_over_ranks(
            {f"w/{g}": v for g, v in weights.items()} | {f"u/{g}": v for g, v in moved.items()}
        )
        groups = sorted({key[2:] for key in sums if key.startswith("w/")})
        for group in groups:
            weight, update = sums[f"w/{group}"], sums.get(f"u/{group}", 0.0)
            driver.record(f"weight_norm/{group}", weight**0.5)
            driver.record(f"update_ratio/{group}", (update / weight) ** 0.5)
        weight_total = total(sums[f"w/{g}"] for g in groups)
        update_total = total(sums[f"u/{g}"] for g in groups if f"u/{g}" in sums)
        driver.record("weight_norm/total", weight_total**0.5)
        driver.record("update_ratio/total", (update_total / weight_total) ** 0.5)
