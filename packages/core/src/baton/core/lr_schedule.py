"""The one learning-rate schedule shape every LLM backend builds: linear warmup, then
cosine decay to a floor at the last step.

Step ``k`` counts optimizer steps from 1 (the driver's step); ``lr(k)`` is the rate that
step ``k``'s update uses and logs:

- ``k <= warmup_steps``: ``peak * k / warmup_steps`` (step 1 already moves the weights);
- after: ``floor + (peak - floor) * (1 + cos(pi * (k - warmup) / (total - warmup))) / 2``,
  which is ``floor`` at ``k = total_steps`` (and after).

Extending a run (``--resume auto --allow-changed max_steps``, ``total_steps`` N -> M)
has one meaning on every backend: the warmup stays as it was, the decay is stretched to
the new total, and the run continues from the restored step on the new curve. A
backend rebuilds its schedule with the new total and keeps its restored step counter;
``resume_line`` says what follows::

    schedule = WarmupCosine(peak=1e-3, floor=1e-4, warmup_steps=2, total_steps=30)
    schedule.lr(21)                  # the first step after a resume at step 20
    schedule.resume_line(20)
    # 'resuming at step 20 of 30: cosine decay continues from lr 0.000311 to 0.0001 at step 30'
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup to ``peak`` over ``warmup_steps``, cosine decay to ``floor`` at
    ``total_steps`` (see the module docstring for the formula)."""

    peak: float
    floor: float
    warmup_steps: int
    total_steps: int

    def factor(self, step: int) -> float:
        """``lr(step) / peak`` (a ``LambdaLR`` factor is ``factor(last_epoch + 1)``)."""
        if self.peak == 0:
            return 0.0
        return self.lr(step) / self.peak

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (counted from 1)."""
        warmup, total = self.warmup_steps, self.total_steps
        if warmup and step <= warmup:
            return self.peak * max(step, 0) / warmup
        if step >= total:
            return self.floor
        progress = (step - warmup) / (total - warmup)
        return self.floor + (self.peak - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def scaled(self, by: float) -> WarmupCosine:
        """The same shape with peak and floor multiplied by ``by`` (a factor's shape
        times an optimizer's base learning rate)."""
        return WarmupCosine(self.peak * by, self.floor * by, self.warmup_steps, self.total_steps)

    def summary(self) -> str:
        """The shape in words, e.g. ``warmup 2 steps to lr 1e-03, cosine decay to 1e-04
        at step 30``."""
        return (
            f"warmup {self.warmup_steps} steps to lr {self.peak:.3g}, cosine decay to "
            f"{self.floor:.3g} at step {self.total_steps}"
        )

    def resume_line(self, step: int) -> str:
        """What the schedule does after a resume at ``step`` (the last step done)."""
        head = f"resuming at step {step} of {self.total_steps}: "
        if step >= self.total_steps:
            return head + f"lr stays at the floor {self.floor:.3g}"
        if step < self.warmup_steps:
            return head + (
                f"warmup continues from lr {self.lr(step + 1):.3g} to {self.peak:.3g} at step "
                f"{self.warmup_steps}, then cosine decay to {self.floor:.3g} at step "
                f"{self.total_steps}"
            )
        return head + (
            f"cosine decay continues from lr {self.lr(step + 1):.3g} to {self.floor:.3g} at "
            f"step {self.total_steps}"
        )


@dataclass(frozen=True)
class EpochFactor:
    """A schedule's factor for a ``LambdaLR``, whose ``last_epoch`` counts the updates
    done: the next update is step ``last_epoch + 1``. Plain numbers only, so the
    scheduler's checkpoint holds no object of baton's.

    >>> EpochFactor.of(WarmupCosine(1.0, 0.1, warmup_steps=2, total_steps=10))(0)
    0.5
    """

    peak: float
    floor: float
    warmup_steps: int
    total_steps: int

    @classmethod
    def of(cls, schedule: WarmupCosine) -> EpochFactor:
        return cls(schedule.peak, schedule.floor, schedule.warmup_steps, schedule.total_steps)

    @property
    def schedule(self) -> WarmupCosine:
        return WarmupCosine(self.peak, self.floor, self.warmup_steps, self.total_steps)

    def __call__(self, last_epoch: int) -> float:
        return self.schedule.factor(last_epoch + 1)
