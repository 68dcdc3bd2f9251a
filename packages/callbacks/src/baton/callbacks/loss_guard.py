"""NaN/Inf and loss-spike guard: stop with a clear message, or roll back and skip.

Example::

    from baton.callbacks import Checkpoint, LossGuard

    Driver(backend, callbacks=[
        Checkpoint(every_n_steps=100),
        LossGuard(action="rollback", spike_factor=3.0, max_rollbacks=3),
    ])

Detection costs no device work at all: the guard judges the loss the log step already
brought to the host (a NaN or Inf in the weights shows in every later loss, so the
next log step sees it; a step whose non-finite loss the backend skipped, as fp16 loss
scaling does, left nothing to guard). A checkpoint step is always checked first (the
guard asks for a log there), so a broken state is never saved: the guard vetoes the
step's save (``control.veto_save``, which also covers the save on stop). A spike is a
logged loss above ``spike_factor`` times the running mean of earlier logged losses.
Ranks agree through ``backend.all_reduce_flags`` before acting.

``action="stop"`` stops the run and names the last good checkpoint.
``action="rollback"`` goes back (``driver.rollback``: newer checkpoints are deleted and
``latest`` points at it) to the newest checkpoint saved at or before the last step known
to be good and skips the data of the steps in between (``backend.skip_data``), up to
``max_rollbacks`` times, then stops. It needs the backend's ``skip_data`` ability: on a
backend without it the run fails before its first step.

Metric keys logged: ``guard/loss_mean`` (the running mean used for spikes),
``guard/rollbacks``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal

from baton.callbacks.rollback import LastGood
from baton.core.callback import GUARD_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import Ability, DriverView, StepOutput

log = logging.getLogger("baton")


@CALLBACKS.register("loss_guard")
class LossGuard(Callback):
    """Detect NaN/Inf or spiking loss on every rank; stop, or roll back and skip data.

    Args:
        action: ``"stop"`` or ``"rollback"``.
        spike_factor: a logged loss above this multiple of the running mean is a
            spike (``None``: only NaN/Inf).
        warmup_logs: log steps before spikes are judged (the early loss falls fast).
        ema: weight of the newest loss in the running mean.
        max_rollbacks: roll back at most this many times, then stop.
    """

    state_key = "loss_guard"
    priority = GUARD_PRIORITY

    def __init__(
        self,
        action: Literal["stop", "rollback"] = "stop",
        *,
        spike_factor: float | None = None,
        warmup_logs: int = 5,
        ema: float = 0.1,
        max_rollbacks: int = 3,
    ) -> None:
        if action not in ("stop", "rollback"):
            raise ValueError(f"action must be 'stop' or 'rollback', got {action!r}")
        if spike_factor is not None and spike_factor <= 1:
            raise ValueError(
                f"spike_factor must be > 1 (a multiple of the mean), got {spike_factor}"
            )
        self.action = action
        self.spike_factor = spike_factor
        self.warmup_logs = warmup_logs
        self.ema = ema
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        self.loss_mean: float | None = None
        self.logs_seen = 0
        self.last_good = LastGood()

    def state_dict(self) -> dict[str, Any]:
        return {
            "rollbacks": self.rollbacks,
            "loss_mean": self.loss_mean,
            "logs_seen": self.logs_seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks = int(state.get("rollbacks", 0))
        self.loss_mean = state.get("loss_mean")
        self.logs_seen = int(state.get("logs_seen", 0))

    def requires(self) -> frozenset[Ability]:
        return frozenset({"skip_data"}) if self.action == "rollback" else frozenset()

    def __repr__(self) -> str:
        return f"LossGuard(action={self.action!r})"

    @property
    def last_good_step(self) -> int:
        """The last step whose logged loss was healthy (or the step loaded)."""
        return self.last_good.step

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        self.last_good.mark(driver.step)

    # -- detection ------------------------------------------------------------------
    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        ctl = driver.control
        if ctl.save:
            # check the state before it is saved. A save every rank makes now needs a
            # log every rank makes now, even where this rank already holds a log request
            # that waits for agreement (a signal): otherwise one rank logs (and reduces
            # in on_log) while the other goes straight to the save's barrier
            agreed = "save" in ctl.agreed
            if (agreed and "log" not in ctl.agreed) or not ctl.log:
                ctl.request_log("loss guard checks before saving", all_ranks=agreed)

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if "loss" not in metrics:
            raise ValueError(
                f"LossGuard: backend {driver.backend.name!r} returned no loss (StepOutput.loss "
                f"is None); the metrics of step {driver.step} are {sorted(metrics)}"
            )
        loss = metrics["loss"]
        nonfinite = not math.isfinite(loss)
        spike = (
            self.spike_factor is not None
            and not nonfinite
            and self.loss_mean is not None
            and self.logs_seen >= self.warmup_logs
            and loss > self.spike_factor * self.loss_mean
        )
        nonfinite, spike = driver.backend.all_reduce_flags([nonfinite, spike])
        metrics["guard/rollbacks"] = float(self.rollbacks)
        if not (nonfinite or spike):
            self.logs_seen += 1
            self.loss_mean = (
                loss
                if self.loss_mean is None
                else ((1 - self.ema) * self.loss_mean + self.ema * loss)
            )
            metrics["guard/loss_mean"] = self.loss_mean
            self.last_good.mark(driver.step)
            return
        what = (
            "a non-finite (NaN/Inf) loss"
            if nonfinite
            else f"a loss spike ({loss:.4g} > {self.spike_factor:g} x mean {self.loss_mean:.4g})"
        )
        self._act(driver, what)

    # -- action ---------------------------------------------------------------------
    def _act(self, driver: DriverView, what: str) -> None:
        # never save the broken state, now or on the way out
        good = self.last_good.refuse_save(driver.control, what, driver.checkpoint_dir)
        where = (
            f"steps {self.last_good_step + 1}..{driver.step}"
            if driver.step > self.last_good_step + 1
            else f"step {driver.step}"
        )
        if self.action == "rollback" and good is not None and self.rollbacks < self.max_rollbacks:
            log.error("%s in %s: rolling back to %s", what, where, good[0])
            self.last_good.roll_back_at_next_step(driver.step)
            return
        if self.action == "rollback" and good is None:
            hint = "no checkpoint at or before the last good step to roll back to"
        elif self.action == "rollback":
            hint = f"already rolled back {self.rollbacks} times (max_rollbacks)"
        else:
            hint = "stopping as configured (action='stop')"
        resume = (
            f"; the last good checkpoint is {good[0]} (resume from it with --resume {good[0]})"
            if good is not None
            else ""
        )
        message = f"{what} in {where}: {hint}{resume}. Lower the learning rate or check the data"
        log.error(message)
        driver.control.request_stop(message, all_ranks=True)

    def on_step_start(self, driver: DriverView) -> None:
        bad_step = self.last_good.roll_back_if_due(driver.checkpoint_dir, driver.rollback)
        if bad_step is None:
            return
        self.rollbacks += 1
        skip = bad_step - driver.step
        backend = driver.backend
        backend.skip_data(skip)
        log.warning("rolled back to step %d, skipped the data of %d steps", driver.step, skip)
