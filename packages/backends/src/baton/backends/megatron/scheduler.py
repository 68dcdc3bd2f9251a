"""Megatron-Core's ``OptimizerParamScheduler`` with the values a callback set through
``model_state`` kept in the optimizer's parameter groups.

Megatron recomputes every group's ``lr`` and ``weight_decay`` from its schedule at each
step, and identifies a group in its checkpoint by the schedule keys (``max_lr``,
``min_lr``, ``start_wd``, ``end_wd``, ``wd_mult``, ...), so a set value cannot live in
those. Two keys of baton's carry it instead, saved and restored with the groups:

- ``baton_lr_scale``: the group's scheduled learning rate is multiplied by it (the
  schedule continues, scaled, from the value set);
- ``baton_weight_decay``: replaces the group's scheduled weight decay.

Its ``cosine`` style is baton's one schedule shape (``baton.core.lr_schedule``: linear
warmup from step 1, cosine decay to ``min_lr`` at ``lr_decay_steps``), the same on every
backend; other styles are Megatron's own. ``num_steps`` counts the updates done, so the
next update is step ``num_steps + 1``.

Example::

    scheduler = BatonParamScheduler(optimizer, init_lr=0.0, max_lr=3e-3, ...)
    optimizer.param_groups[0][LR_SCALE] = 0.5      # from now on half the schedule
"""

from __future__ import annotations

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from baton.core.lr_schedule import WarmupCosine

#: a group's factor on its scheduled learning rate
LR_SCALE = "baton_lr_scale"
#: a group's weight decay, in place of the scheduled one
WEIGHT_DECAY = "baton_weight_decay"


class BatonParamScheduler(OptimizerParamScheduler):
    """``OptimizerParamScheduler`` that applies each group's ``LR_SCALE`` and
    ``WEIGHT_DECAY`` after scheduling (groups without them: Megatron's values)."""

    def shape(self, group: dict[str, object] | None = None) -> WarmupCosine:
        """The cosine style's schedule (of ``group``'s peak and floor when it has them)."""
        group = group or {}
        peak, floor = group.get("max_lr", self.max_lr), group.get("min_lr", self.min_lr)
        assert isinstance(peak, float | int) and isinstance(floor, float | int)
        return WarmupCosine(
            peak=float(peak),
            floor=float(floor),
            warmup_steps=int(self.lr_warmup_steps),
            total_steps=int(self.lr_decay_steps),
        )

    def get_lr(self, param_group: dict[str, object]) -> float:
        if self.lr_decay_style != "cosine":
            return super().get_lr(param_group)
        return self.shape(param_group).lr(int(self.num_steps) + 1)

    def extend(self, decay_steps: int) -> None:
        """After loading: decay to the floor at ``decay_steps`` (the restored step and
        warmup kept), every group's learning rate recomputed for the next update."""
        self.lr_decay_steps = decay_steps
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
