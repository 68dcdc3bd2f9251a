"""TorchTitan's ``LRSchedulersContainer`` on baton's one schedule (``baton.core.lr_schedule``:
linear warmup from step 1, then constant, linear or cosine decay to the floor at the last
step), so a run's learning rates are the same as on every other backend.

TorchTitan keeps only ``last_epoch`` in its checkpoint and rebuilds the factor from the
config, so a run resumed with a longer ``training.steps`` continues at the restored step
on the curve stretched to the new total, with the warmup it had::

    schedule = resolve_schedule("pretrain", lr=8e-4, max_steps=30, warmup_steps=2)
    config.lr_scheduler = schedule_config(schedule)
    config.training.steps = 30          # the schedule ends at the floor at step 30
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

from baton.core.lr_schedule import EpochFactor, LRSchedule


@dataclass(kw_only=True, slots=True)
class BatonScheduleConfig(LRSchedulersContainer.Config):
    """``LRSchedulersContainer.Config`` whose factor is baton's ``LRSchedule`` (peak 1,
    floor ``min_lr_factor``, ``shape`` after the warmup, over ``total_steps`` or the
    training steps)."""

    shape: str = "cosine"
    """What the rate does after the warmup: constant, linear or cosine (to the floor)."""

    def build(self, *, optimizers: Any, training_steps: int) -> LRSchedulersContainer:  # pyright: ignore[reportIncompatibleMethodOverride]
        total = self.total_steps if self.total_steps is not None else training_steps
        return LRSchedulersContainer(optimizers, EpochFactor.of(shape_of(self, total)))


def shape_of(config: Any, total_steps: int, peak: float = 1.0) -> LRSchedule:
    """The schedule ``config`` (a ``BatonScheduleConfig``) builds over ``total_steps`` at
    ``peak``."""
    return LRSchedule(
        peak=peak,
        floor=peak * config.min_lr_factor,
        warmup_steps=min(int(config.warmup_steps), total_steps),
        total_steps=total_steps,
        decay=str(getattr(config, "shape", "cosine")),
    )


def schedule_config(schedule: LRSchedule) -> BatonScheduleConfig:
    """``schedule`` (a recipe's, ``resolve_schedule``) as TorchTitan's
    ``config.lr_scheduler``; its peak is the optimizer's ``lr``, its total the run's
    ``training.steps``."""
    factor = schedule.floor / schedule.peak if schedule.peak else 0.0
    return BatonScheduleConfig(
        warmup_steps=schedule.warmup_steps, min_lr_factor=factor, shape=schedule.decay
    )
