"""Baton's one learning-rate schedule (``baton.core.lr_schedule``) as the ``scheduler``
factory of a ``FabricBackend``: a ``LambdaLR`` whose factor is the schedule over the
optimizer's ``lr`` (plain numbers in its checkpoint, the shape its class), so a Fabric run
logs the ``lr`` every other engine logs.

Example (what the Fabric recipes do)::

    schedule = resolve_schedule("sft", lr=3e-3, max_steps=20)     # constant 3e-3
    FabricBackend(model, optimizer=adamw(3e-3), scheduler=lambda_scheduler(schedule), ...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from baton.core.lr_schedule import EpochFactor, LRSchedule


def lambda_scheduler(
    schedule: LRSchedule,
) -> Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR]:
    """A ``LambdaLR`` factory following ``schedule``, as a factor of the optimizer's
    ``lr`` (which should be ``schedule.peak``)."""
    floor = schedule.floor / schedule.peak if schedule.peak else 0.0
    unit = replace(schedule, peak=1.0, floor=floor)
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, EpochFactor.of(unit))
