"""Early stopping: stop when a monitored metric has not improved for ``patience`` checks.

Example::

    Driver(backend, callbacks=[EarlyStopping("eval/loss", patience=3, min_delta=1e-3)],
           eval_every=200)

Each evaluation (for ``eval/...`` keys and names a backend's evaluation keeps, such as
a LightningModule's ``val_loss``) or each log step (for training keys) is one
check; a ``monitor`` key missing from the first metrics of its phase stops the run with
an error listing the keys that exist. The best value and the count
of checks without improvement are saved in checkpoints, so a resumed run keeps its
patience. The stop saves a checkpoint when a ``Checkpoint`` callback asks for saves
on stop.

Metric keys logged: ``early_stopping/best``, ``early_stopping/wait``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal

from baton.callbacks.metric_keys import Monitored, evaluation_may_name
from baton.core.callback import GUARD_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import Ability, DriverView

log = logging.getLogger("baton")


@CALLBACKS.register("early_stopping")
class EarlyStopping(Callback):
    """Stop after ``patience`` checks of ``monitor`` without an improvement of ``min_delta``.

    Args:
        monitor: the metric watched (an evaluation metric such as eval/loss, or a
            training metric such as loss).
        patience: checks without improvement before the run stops.
        mode: "min" (lower is better) or "max".
        min_delta: the smallest change that counts as an improvement.
    """

    state_key = "early_stopping"
    priority = GUARD_PRIORITY

    def __init__(
        self,
        monitor: str = "eval/loss",
        *,
        patience: int = 3,
        mode: Literal["min", "max"] = "min",
        min_delta: float = 0.0,
    ) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor = monitor
        self._monitored = Monitored(monitor, "EarlyStopping")
        self.patience = patience
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.best: float | None = None
        self.wait = 0

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") != self.monitor:
            log.warning(
                "early stopping monitored %r before the resume and %r now: starting afresh",
                state.get("monitor"),
                self.monitor,
            )
            return
        self.best = state.get("best")
        self.wait = int(state.get("wait", 0))

    def improved(self, value: float) -> bool:
        if self.best is None:
            return math.isfinite(value)
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def requires(self) -> frozenset[Ability]:
        return frozenset({"evaluate"}) if self._monitored.phase == "eval" else frozenset()

    def __repr__(self) -> str:
        return f"EarlyStopping(monitor={self.monitor!r})"

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._check(driver, "train", metrics)

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._check(driver, "eval", metrics)

    def _check(self, driver: DriverView, phase: Phase, metrics: dict[str, float]) -> None:
        value = self._monitored.read(
            phase, driver.step, metrics, named_eval=evaluation_may_name(driver)
        )
        if value is None:
            return
        if self.improved(value):
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        metrics["early_stopping/best"] = self.best if self.best is not None else float("nan")
        metrics["early_stopping/wait"] = float(self.wait)
        if self.wait >= self.patience:
            reason = (
                f"early stopping: {self.monitor} did not improve on {self.best:.6g} "
                f"for {self.wait} checks (patience {self.patience})"
            )
            driver.control.request_stop(reason)
