"""Learning rate and gradient norm under standard keys, where the backend reports them.

Example::

    Driver(backend, callbacks=[OptimizerMonitor()])
    # metrics["optim/lr"], metrics["optim/grad_norm"]

Backends name these differently (``lr``, ``learning_rate``, ``grad_norm``,
``grad-norm``, ``total_norm``...); this callback copies the first found under
``optim/lr`` and ``optim/grad_norm`` so dashboards compare backends directly, and
says once which of them the backend does not report. It reads only values the
step already returned: no extra device sync.

Metric keys logged: ``optim/lr``, ``optim/grad_norm``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView

log = logging.getLogger("baton")

LR_KEYS = ("lr", "learning_rate", "learning-rate", "optim/learning_rate")
GRAD_NORM_KEYS = ("grad_norm", "grad-norm", "gradient_norm", "total_norm", "grad_norm/total")


@CALLBACKS.register("optimizer_monitor")
class OptimizerMonitor(Callback):
    """Copy the backend's learning rate and grad norm to ``optim/lr`` / ``optim/grad_norm``.

    Args:
        lr_keys: metric keys that may hold the learning rate, the first logged is used.
        grad_norm_keys: metric keys that may hold the gradient norm, likewise.
    """

    priority = METRIC_PRIORITY

    def __init__(
        self, lr_keys: Sequence[str] = LR_KEYS, grad_norm_keys: Sequence[str] = GRAD_NORM_KEYS
    ) -> None:
        self.aliases = {"optim/lr": tuple(lr_keys), "optim/grad_norm": tuple(grad_norm_keys)}
        self._reported = False

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        missing: list[str] = []
        for target, keys in self.aliases.items():
            found = next((k for k in keys if k in metrics), None)
            if found is None:
                missing.append(target)
            else:
                metrics[target] = metrics[found]
        if missing and not self._reported:
            log.info("backend %s does not report %s", driver.backend.name, ", ".join(missing))
        self._reported = True
