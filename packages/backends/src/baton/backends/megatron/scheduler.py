"""Megatron-Core's ``OptimizerParamScheduler`` with the values a callback set through
``model_state`` kept in the optimizer's parameter groups.

Megatron recomputes every group's ``lr`` and ``weight_decay`` from its schedule at each
step, and identifies a group in its checkpoint by the schedule keys (``max_lr``,
``min_lr``, ``start_wd``, ``end_wd``, ``wd_mult``, ...), so a set value cannot live in
those. Two keys of baton's carry it instead, saved and restored with the groups:

- ``baton_lr_scale``: the group's scheduled learning rate is multiplied by it (the
  schedule continues, scaled, from the value set);
- ``baton_weight_decay``: replaces the group's scheduled weight decay.

Baton's one schedule (``baton.core.lr_schedule``: linear warmup from step 1, then
constant, linear or cosine decay to the floor at the last step) is Megatron's own
``constant``, ``linear`` or ``cosine`` style with the arguments of
``schedule_arguments`` (Megatron's ``num_steps`` counts the updates done, so its warmup
starts one step later and its decay ends one step later than baton's unless shifted),
and a scheduler built for it (``shape`` set) takes each group's rate from that shape
itself, ``shape.lr(num_steps + 1)`` with the group's ``max_lr``/``min_lr``: the ``lr``
a Megatron step logs is the one every engine logs, bit for bit. Baton's shape computes in
Megatron's order, so with a warmup of two steps or more Megatron's own formula gives the
same floats (a plain Megatron-Core loop with these arguments trains identically); with
one step its first rate is ``floor + (peak - floor)``, and with none it cannot start a
decay one step in (its first update would take the peak).

Example::

    scheduler = BatonParamScheduler(optimizer, init_lr=0.0, max_lr=3e-3, ...)
    optimizer.param_groups[0][LR_SCALE] = 0.5      # from now on half the schedule
"""

from __future__ import annotations

from dataclasses import replace

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from baton.core.lr_schedule import LRSchedule

#: a group's factor on its scheduled learning rate
LR_SCALE = "baton_lr_scale"
#: a group's weight decay, in place of the scheduled one
WEIGHT_DECAY = "baton_weight_decay"


class BatonParamScheduler(OptimizerParamScheduler):
    """``OptimizerParamScheduler`` that applies each group's ``LR_SCALE`` and
    ``WEIGHT_DECAY`` after scheduling (groups without them: Megatron's values)."""

    #: baton's schedule this scheduler was built to follow (``schedule_arguments``), if any
    shape: LRSchedule | None = None

    def follow(self, shape: LRSchedule) -> None:
        """From now on every group's rate is ``shape``'s (with the group's own
        ``max_lr``/``min_lr``), set at once for the next update."""
        self.shape = shape
        self.step(increment=0)

    def get_lr(self, param_group: dict[str, object]) -> float:
        """The group's rate for the next update: baton's ``shape`` at step
        ``num_steps + 1`` where one is followed, else Megatron's own."""
        shape = self.shape
        if shape is None:
            return super().get_lr(param_group)
        peak = param_group.get("max_lr", self.max_lr)
        floor = param_group.get("min_lr", self.min_lr)
        if (peak, floor) != (shape.peak, shape.floor):
            shape = replace(shape, peak=float(peak), floor=float(floor))  # pyright: ignore[reportArgumentType]
        return shape.lr(self.num_steps + 1)

    def extend(self, total_steps: int) -> None:
        """After loading: decay to the floor at ``total_steps`` (the restored step and
        warmup kept), every group's learning rate recomputed for the next update."""
        if self.shape is not None:
            self.shape = self.shape.with_total(total_steps)
            self.lr_decay_steps = schedule_arguments(self.shape)["lr_decay_steps"]
        else:
            self.lr_decay_steps = total_steps
        self.step(increment=0)

    def step(self, increment: int) -> None:
        super().step(increment)
        for group in self.optimizer.param_groups:
            scale = group.get(LR_SCALE)
            if scale is not None:
                set_lr(group, self.get_lr(group) * scale)
            decay = group.get(WEIGHT_DECAY)
            if decay is not None:
                group["weight_decay"] = decay


def set_lr(group: dict[str, object], value: float) -> None:
    """Set a group's ``lr`` (a float, or a tensor filled in place)."""
    import torch

    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        lr.fill_(value)
    else:
        group["lr"] = value


def schedule_arguments(shape: LRSchedule) -> dict[str, object]:
    """Megatron's ``OptimizerParamScheduler`` arguments that give ``shape`` (update ``k``
    uses ``shape.lr(k)``; Megatron computes it at ``num_steps = k - 1``): a warmup one
    step shorter from ``peak / warmup``, a decay ending one step earlier, Megatron's
    style of the same name.

    >>> schedule_arguments(LRSchedule(1e-3, 1e-4, warmup_steps=2, total_steps=10))
    {'init_lr': 0.0005, 'max_lr': 0.001, 'min_lr': 0.0001, 'lr_warmup_steps': 1, \
'lr_decay_steps': 9, 'lr_decay_style': 'cosine'}
    """
    warmup = max(shape.warmup_steps - 1, 0)
    return {
        "init_lr": shape.peak / shape.warmup_steps if shape.warmup_steps else shape.peak,
        "max_lr": shape.peak,
        "min_lr": shape.floor,
        "lr_warmup_steps": warmup,
        "lr_decay_steps": max(shape.total_steps - 1, warmup + 1),
        "lr_decay_style": shape.decay,
    }
