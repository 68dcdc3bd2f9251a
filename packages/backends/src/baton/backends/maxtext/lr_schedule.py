"""MaxText's learning rate on baton's one schedule (``baton.core.lr_schedule``: linear
warmup from step 1, then constant, linear or cosine decay to the floor at the last step).

MaxText builds its optax schedule from its config in ``create_learning_rate_schedule``
(its warmup a fraction of the schedule's steps, which moves when the run gets longer).
``baton_schedule`` puts this shape in its place while the train loop is set up: the
optimizer's transform and the logged ``lr`` both use it. The schedule is a function of
the optimizer's restored ``count``, so a run resumed with a longer ``steps`` continues
at the restored step on the curve stretched to the new total, with the warmup it had;
the train step is compiled at setup with it, as every run's is (nothing recompiles
later)::

    with baton_schedule(warmup_steps=2, decay="cosine"):
        ... = train_utils.setup_train_loop(cfg, recorder)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from baton.core.lr_schedule import LRSchedule


def shape_of(cfg: Any, warmup_steps: int, decay: str = "cosine") -> LRSchedule:
    """The schedule of MaxText's resolved config ``cfg`` with ``warmup_steps`` and
    ``decay`` after them."""
    total = int(cfg.learning_rate_schedule_steps)
    peak = float(cfg.learning_rate)
    return LRSchedule(
        peak=peak,
        floor=peak * float(cfg.learning_rate_final_fraction),
        warmup_steps=min(warmup_steps, total),
        total_steps=total,
        decay=decay,
    )


def optax_schedule(shape: LRSchedule) -> Callable[[Any], Any]:
    """``shape`` as an optax schedule of the optimizer's ``count`` (the updates done:
    the next update is step ``count + 1``), traceable by ``jax.jit``."""
    import jax.numpy as jnp

    warmup, total = shape.warmup_steps, shape.total_steps

    def schedule(count: Any) -> Any:
        step = jnp.asarray(count, jnp.float32) + 1
        warming = shape.peak * step / max(warmup, 1)
        progress = jnp.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
        if shape.decay == "constant":
            after = jnp.full_like(step, shape.peak)
        elif shape.decay == "linear":
            after = shape.floor + (shape.peak - shape.floor) * (1 - progress)
        else:
            cosine = 0.5 * (1 + jnp.cos(jnp.pi * progress))
            after = shape.floor + (shape.peak - shape.floor) * cosine
        return jnp.where(step <= warmup, warming, after)

    return schedule


@contextmanager
def baton_schedule(warmup_steps: int, decay: str = "cosine") -> Iterator[None]:
    """MaxText's ``create_learning_rate_schedule`` builds baton's shape inside."""
    from maxtext.utils import maxtext_utils

    original = maxtext_utils.create_learning_rate_schedule
    maxtext_utils.create_learning_rate_schedule = lambda config: optax_schedule(
        shape_of(config, warmup_steps, decay)
    )
    try:
        yield
    finally:
        maxtext_utils.create_learning_rate_schedule = original
