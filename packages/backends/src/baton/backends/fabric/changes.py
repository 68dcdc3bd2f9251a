"""Re-applying changed training settings after a resume: the learning rate and schedule
the new run built win over the ones its checkpoint restores.

Loading a checkpoint restores the optimizer's learning rates (``lr``, ``initial_lr``) and
the scheduler's state (``base_lrs``, ``last_epoch``, a cosine's ``T_max``), which would
keep the checkpoint's values however the new run was configured. ``AsBuilt`` records the
rates and schedules as the recipe built them (before loading) and puts them back after,
advancing each rebuilt schedule to the restored step::

    built = AsBuilt.take(optimizer, schedulers)       # end of setup
    ...                                               # load the checkpoint
    built.reapply(optimizer, schedulers, {"lr", "max_steps"})
    # -> {"lr", "max_steps"}: the schedule continues at the new peak, for the new length
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from baton.core.lr_schedule import EpochFactor

log = logging.getLogger("baton")

#: settings that the optimizer's learning rates are built from
LR_SETTINGS: frozenset[str] = frozenset({"lr", "learning_rate"})
#: settings that a learning-rate schedule is built from (its peak, floor, warmup, length)
SCHEDULE_SETTINGS: frozenset[str] = LR_SETTINGS | frozenset(
    {"min_lr", "min_lr_ratio", "warmup_steps", "decay_steps", "max_steps"}
)


def base_lrs(optimizer: Any) -> list[float]:
    """Each param group's peak learning rate (``initial_lr`` once a scheduler set it)."""
    return [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]


@dataclass
class AsBuilt:
    """The learning rates and scheduler states as the recipe built them, before loading."""

    groups: list[dict[str, Any]]
    schedulers: list[dict[str, Any]]

    @classmethod
    def take(cls, optimizer: Any, schedulers: Sequence[Any]) -> AsBuilt:
        groups = [
            {k: copy.deepcopy(g[k]) for k in ("lr", "initial_lr") if k in g}
            for g in optimizer.param_groups
        ]
        return cls(groups, [copy.deepcopy(s.state_dict()) for s in schedulers])

    def reapply(self, optimizer: Any, schedulers: Sequence[Any], names: Iterable[str]) -> set[str]:
        """Put back the built learning rates and rebuild every schedule at the restored
        step for the changed ``names``; returns the names applied. A changed ``lr`` that
        did not reach the optimizer (the built rates equal the restored ones) is not."""
        names = set(names)
        applied: set[str] = set()
        restored = base_lrs(optimizer)
        built = [g.get("initial_lr", g.get("lr")) for g in self.groups]
        lr_names = names & LR_SETTINGS
        if lr_names and built != restored:
            applied |= lr_names
        schedule_names = names & (SCHEDULE_SETTINGS - LR_SETTINGS)
        if not (applied or schedule_names):
            return applied
        for group, values in zip(optimizer.param_groups, self.groups, strict=True):
            group.update(copy.deepcopy(values))
        pairs = zip(schedulers, self.schedulers, strict=True)
        steps = [self._rebuild(scheduler, state) for scheduler, state in pairs]
        applied |= schedule_names
        _say_what_follows(schedulers, steps)
        log.info(
            "resume: %s re-applied after loading: peak lr %s (the checkpoint's %s)%s",
            ", ".join(sorted(applied)),
            _short(built),
            _short(restored),
            f", schedule rebuilt at step {steps[0]}: lr {optimizer.param_groups[0]['lr']:.4g}"
            if steps
            else "",
        )
        return applied

    @staticmethod
    def _rebuild(scheduler: Any, built: dict[str, Any]) -> int:
        """The scheduler as built, advanced to the step the checkpoint restored."""
        step = scheduler.last_epoch
        scheduler.load_state_dict(copy.deepcopy(built))
        with warnings.catch_warnings():  # "step() before optimizer.step()": replaying
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(step - scheduler.last_epoch):
                scheduler.step()
        return step


def _say_what_follows(schedulers: Sequence[Any], steps: Sequence[int]) -> None:
    """The resume line of the first scheduler on baton's schedule shape (``EpochFactor``)."""
    for scheduler, step in zip(schedulers, steps, strict=True):
        factor = next(iter(getattr(scheduler, "lr_lambdas", [])), None)
        if isinstance(factor, EpochFactor):
            shape = factor.schedule.scaled(float(scheduler.base_lrs[0]))
            log.info(shape.resume_line(step))
            return


def _short(values: list[Any]) -> str:
    distinct = sorted({float(v) for v in values})
    return f"{distinct[0]:.4g}" if len(distinct) == 1 else str([f"{v:.4g}" for v in values])
