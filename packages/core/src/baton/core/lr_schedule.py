"""The one learning-rate schedule every LLM backend builds: linear warmup, then the
rate held (``constant``) or decayed (``linear``, ``cosine``) to a floor at the last step;
and each objective's default, the same on every engine.

Step ``k`` counts optimizer steps from 1 (the driver's step); ``lr(k)`` is the rate that
step ``k``'s update uses and logs:

- ``k <= warmup_steps``: ``peak * k / warmup_steps`` (step 1 already moves the weights;
  computed in Megatron-Core's order, from ``peak / warmup_steps``);
- after, with ``progress = (k - warmup) / (total - warmup)``:

  - ``constant``: ``peak`` (the floor is not used);
  - ``linear``: ``floor + (peak - floor) * (1 - progress)``;
  - ``cosine``: ``floor + (peak - floor) * (1 + cos(pi * progress)) / 2``;

  ``linear`` and ``cosine`` are ``floor`` at ``k = total_steps`` (and after).

Every recipe takes ``--lr-schedule constant|linear|cosine``, ``--warmup-steps`` and
``--min-lr``; ``resolve_schedule`` turns them into one ``LRSchedule`` with the same
defaults on every engine: the shape the objective declares (``Objective.lr_schedule``:
cosine for pretraining, constant for SFT, DPO and GRPO), no warmup (a count of steps, so
that extending a run keeps it) and a floor of a tenth of ``--lr``. Each
engine turns it into its own scheduler (a ``LambdaLR`` factor, TorchTitan's
``LRSchedulersContainer``, Megatron's ``OptimizerParamScheduler``, MaxText's optax
schedule), so every engine logs the same ``lr`` at every step.

Extending a run (``--resume auto --allow-changed max_steps``, ``total_steps`` N -> M)
has one meaning on every backend: the warmup stays as it was, the decay is stretched to
the new total, and the run continues from the restored step on the new curve. A
backend rebuilds its schedule with the new total and keeps its restored step counter;
``resume_line`` says what follows::

    schedule = LRSchedule(peak=1e-3, floor=1e-4, warmup_steps=2, total_steps=30)
    schedule.lr(21)                  # the first step after a resume at step 20
    schedule.resume_line(20)
    # 'resuming at step 20 of 30: cosine decay continues from lr 0.000311 to 0.0001 at step 30'
    resolve_schedule(objective_named("sft"), lr=3e-3, max_steps=20).summary()
    # 'constant lr 0.003'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from baton.core.errors import UsageError
from baton.core.objectives.declaration import Objective

#: what the rate does after the warmup
SHAPES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup to ``peak`` over ``warmup_steps``, then ``decay`` (``constant``,
    ``linear`` or ``cosine``) to ``floor`` at ``total_steps`` (see the module docstring)."""

    peak: float
    floor: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"

    def __post_init__(self) -> None:
        if self.decay not in SHAPES:
            raise ValueError(f"schedule {self.decay!r}: use one of {', '.join(SHAPES)}")

    def factor(self, step: int) -> float:
        """``lr(step) / peak`` (a ``LambdaLR`` factor is ``factor(last_epoch + 1)``)."""
        if self.peak == 0:
            return 0.0
        return self.lr(step) / self.peak

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (counted from 1)."""
        warmup, total = self.warmup_steps, self.total_steps
        if warmup and step <= warmup:
            return self._warming(max(step, 0))
        if self.decay == "constant":
            return self.peak
        if step >= total:
            return self.floor
        progress = (step - warmup) / (total - warmup)
        if self.decay == "linear":
            return self.floor + (self.peak - self.floor) * (1 - progress)
        return self.floor + (self.peak - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def _warming(self, step: int) -> float:
        """``peak * step / warmup_steps``, computed as Megatron-Core's scheduler computes
        its warmup from ``peak / warmup_steps`` (``init + (peak - init) * (step - 1) /
        (warmup - 1)``), so its rates equal these bit for bit."""
        warmup = self.warmup_steps
        init = self.peak / warmup
        if step == 0:
            return 0.0
        if warmup == 1:
            return self.peak
        return init + ((self.peak - init) * float(step - 1)) / float(warmup - 1)

    def scaled(self, by: float) -> LRSchedule:
        """The same shape with peak and floor multiplied by ``by`` (a factor's shape
        times an optimizer's base learning rate)."""
        return replace(self, peak=self.peak * by, floor=self.floor * by)

    def with_total(self, total_steps: int) -> LRSchedule:
        """The same shape ending at ``total_steps`` (a run extended on resume)."""
        return replace(self, total_steps=total_steps)

    def summary(self) -> str:
        """The shape in words, e.g. ``warmup 2 steps to lr 1e-03, cosine decay to 1e-04
        at step 30``."""
        if self.decay == "constant":
            rate = f"constant lr {self.peak:.3g}"
            return rate if not self.warmup_steps else f"warmup {self.warmup_steps} steps to {rate}"
        return (
            f"warmup {self.warmup_steps} steps to lr {self.peak:.3g}, {self.decay} decay to "
            f"{self.floor:.3g} at step {self.total_steps}"
        )

    def resume_line(self, step: int) -> str:
        """What the schedule does after a resume at ``step`` (the last step done)."""
        head = f"resuming at step {step} of {self.total_steps}: "
        if self.decay == "constant":
            if step < self.warmup_steps:
                return head + (
                    f"warmup continues from lr {self.lr(step + 1):.3g} to {self.peak:.3g} at "
                    f"step {self.warmup_steps}, then stays there"
                )
            return head + f"lr stays at {self.peak:.3g}"
        if step >= self.total_steps:
            return head + f"lr stays at the floor {self.floor:.3g}"
        if step < self.warmup_steps:
            return head + (
                f"warmup continues from lr {self.lr(step + 1):.3g} to {self.peak:.3g} at step "
                f"{self.warmup_steps}, then {self.decay} decay to {self.floor:.3g} at step "
                f"{self.total_steps}"
            )
        return head + (
            f"{self.decay} decay continues from lr {self.lr(step + 1):.3g} to {self.floor:.3g} at "
            f"step {self.total_steps}"
        )


#: the cosine shape's name before the other shapes came (``decay`` defaults to cosine)
WarmupCosine = LRSchedule


def resolve_schedule(
    objective: Objective,
    *,
    lr: float,
    max_steps: int,
    lr_schedule: str | None = None,
    warmup_steps: int = 0,
    min_lr: float | None = None,
) -> LRSchedule:
    """The schedule of a recipe's ``--lr``, ``--max-steps``, ``--lr-schedule``,
    ``--warmup-steps`` and ``--min-lr`` for ``objective`` (its ``lr_schedule`` when
    ``--lr-schedule`` is not given), with the defaults of the module docstring; a
    ``UsageError`` (one line) for a shape outside ``SHAPES``, a negative warmup or a
    floor outside ``[0, lr]``."""
    shape = objective.lr_schedule if lr_schedule is None else lr_schedule
    if shape not in SHAPES:
        raise UsageError(f"--lr-schedule {shape!r}: use one of {', '.join(SHAPES)}")
    if warmup_steps < 0:
        raise UsageError(f"--warmup-steps {warmup_steps}: must be 0 or more")
    floor = lr / 10 if min_lr is None else min_lr
    if min_lr is not None and not 0 <= min_lr <= lr:
        raise UsageError(
            f"--min-lr {min_lr:g} must be between 0 and --lr ({lr:g}): the schedule decays "
            "from --lr down to --min-lr; lower --min-lr"
        )
    total = max(max_steps, 1)
    return LRSchedule(lr, floor, min(warmup_steps, total), total, shape)


class EpochFactor:
    """A schedule's factor for a ``LambdaLR``, whose ``last_epoch`` counts the updates
    done: the next update is step ``last_epoch + 1``. Plain numbers only, so the
    scheduler's checkpoint holds no object of baton's; the shape is the class
    (``EpochFactor.of`` picks it: ``CosineFactor``, ``LinearFactor``, ``ConstantFactor``).

    >>> EpochFactor.of(LRSchedule(1.0, 0.1, warmup_steps=2, total_steps=10))(0)
    0.5
    """

    #: the shape this factor follows
    decay: ClassVar[str] = "cosine"

    def __init__(self, peak: float, floor: float, warmup_steps: int, total_steps: int) -> None:
        self.peak, self.floor = peak, floor
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    @classmethod
    def of(cls, schedule: LRSchedule) -> EpochFactor:
        factor = FACTORS[schedule.decay]
        return factor(schedule.peak, schedule.floor, schedule.warmup_steps, schedule.total_steps)

    @property
    def schedule(self) -> LRSchedule:
        return LRSchedule(self.peak, self.floor, self.warmup_steps, self.total_steps, self.decay)

    def __call__(self, last_epoch: int) -> float:
        return self.schedule.factor(last_epoch + 1)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), *vars(self).values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.schedule.summary()})"


class CosineFactor(EpochFactor):
    """``EpochFactor`` of a cosine decay."""

    decay: ClassVar[str] = "cosine"


class LinearFactor(EpochFactor):
    """``EpochFactor`` of a linear decay."""

    decay: ClassVar[str] = "linear"


class ConstantFactor(EpochFactor):
    """``EpochFactor`` of a rate held after the warmup."""

    decay: ClassVar[str] = "constant"


#: the factor class of each shape
FACTORS: dict[str, type[EpochFactor]] = {
    "cosine": CosineFactor,
    "linear": LinearFactor,
    "constant": ConstantFactor,
}
