"""TorchTitan's ``LRSchedulersContainer`` on baton's one schedule shape
(``baton.core.lr_schedule``: linear warmup from step 1, cosine decay to the floor at the
last step), so a run's learning rates are the same as on every other backend.

TorchTitan keeps only ``last_epoch`` in its checkpoint and rebuilds the factor from the
config, so a run resumed with a longer ``training.steps`` continues at the restored step
on the curve stretched to the new total, with the warmup it had::

    config.lr_scheduler = warmup_cosine_config(warmup_steps=2, min_lr_factor=0.1)
    config.training.steps = 30          # the schedule ends at the floor at step 30
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

from baton.core.lr_schedule import EpochFactor, WarmupCosine


@dataclass(kw_only=True, slots=True)
class WarmupCosineConfig(LRSchedulersContainer.Config):
    """``LRSchedulersContainer.Config`` whose factor is ``WarmupCosine`` (peak 1, floor
    ``min_lr_factor``, over ``total_steps`` or the training steps)."""

    def build(self, *, optimizers: Any, training_steps: int) -> LRSchedulersContainer:  # pyright: ignore[reportIncompatibleMethodOverride]
        total = self.total_steps if self.total_steps is not None else training_steps
        return LRSchedulersContainer(optimizers, EpochFactor.of(shape_of(self, total)))


def shape_of(config: Any, total_steps: int, peak: float = 1.0) -> WarmupCosine:
    """The schedule ``config`` (an ``LRSchedulersContainer.Config``) builds over
    ``total_steps`` at ``peak``."""
    return WarmupCosine(
        peak=peak,
        floor=peak * config.min_lr_factor,
        warmup_steps=min(int(config.warmup_steps), total_steps),
        total_steps=total_steps,
    )


def warmup_cosine_config(warmup_steps: int, min_lr_factor: float) -> WarmupCosineConfig:
    """Baton's schedule shape as TorchTitan's ``config.lr_scheduler``."""
    return WarmupCosineConfig(warmup_steps=warmup_steps, min_lr_factor=min_lr_factor)
