"""Every engine's own scheduler built from baton's schedule gives the same rate at every
step: Fabric's ``LambdaLR``, TorchTitan's ``LRSchedulersContainer`` and MaxText's optax
schedule (MaxText's in float32), for constant, linear and cosine after a warmup.
Megatron-Core's is ``megatron/test_megatron_schedule.py`` (bit for bit)."""

from __future__ import annotations

import pytest

from baton.core.lr_schedule import LRSchedule

SHAPES = [LRSchedule(3e-3, 3e-4, warmup, 9, decay)
          for decay in ("constant", "linear", "cosine") for warmup in (0, 2)]  # fmt: skip


def expected(shape: LRSchedule) -> list[float]:
    return [shape.lr(k) for k in range(1, shape.total_steps + 3)]


def torch_rates(optimizer, scheduler, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_fabric_lambda_lr(shape: LRSchedule) -> None:
    import torch

    from baton.backends.fabric.lr_schedule import lambda_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=shape.peak)
    scheduler = lambda_scheduler(shape)(optimizer)
    rates = torch_rates(optimizer, scheduler, shape.total_steps + 2)
    assert rates == pytest.approx(expected(shape), rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_torchtitan_schedulers_container(shape: LRSchedule) -> None:
    import torch

    pytest.importorskip("torchtitan")
    from baton.backends.torchtitan.lr_schedule import schedule_config

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=shape.peak)
    container = schedule_config(shape).build(optimizers=[optimizer], training_steps=9)
    scheduler = container.schedulers[0]
    rates = torch_rates(optimizer, scheduler, shape.total_steps + 2)
    assert rates == pytest.approx(expected(shape), rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.decay}-{s.warmup_steps}")
def test_maxtext_optax_schedule(shape: LRSchedule) -> None:
    pytest.importorskip("jax")
    import jax

    from baton.backends.maxtext.lr_schedule import optax_schedule

    schedule = jax.jit(optax_schedule(shape))
    rates = [float(schedule(count)) for count in range(shape.total_steps + 2)]
    assert rates == pytest.approx(expected(shape), rel=1e-6)  # float32
