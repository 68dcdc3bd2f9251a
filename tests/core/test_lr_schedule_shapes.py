"""The schedule shapes every engine builds (constant, linear, cosine after a linear
warmup), each objective's default, and the flags' refusals."""

from __future__ import annotations

import math

import pytest

from baton.core.errors import UsageError
from baton.core.lr_schedule import (
    ConstantFactor,
    CosineFactor,
    EpochFactor,
    LinearFactor,
    LRSchedule,
    resolve_schedule,
)
from baton.core.objectives import (
    OBJECTIVES,
    DataKind,
    LossTerms,
    Objective,
    objective_named,
)
from baton.core.objectives.sft import supervised_tokens


def test_each_shape_after_the_same_warmup() -> None:
    rates = {
        decay: [LRSchedule(1e-3, 1e-4, 2, 6, decay).lr(k) for k in range(1, 8)]
        for decay in ("constant", "linear", "cosine")
    }
    warmup = [5e-4, 1e-3]
    assert rates["constant"] == pytest.approx(warmup + [1e-3] * 5)
    assert rates["linear"] == pytest.approx(
        warmup + [1e-4 + 9e-4 * (1 - p / 4) for p in range(1, 5)] + [1e-4]
    )
    cosine = [1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * p / 4)) for p in range(1, 5)]
    assert rates["cosine"] == pytest.approx(warmup + cosine + [1e-4])


def test_the_default_of_each_objective_is_its_declaration_s() -> None:
    shipped = {
        name: OBJECTIVES.get(name).lr_schedule for name in ("pretrain", "sft", "dpo", "grpo")
    }
    assert shipped == {
        "pretrain": "cosine",
        "sft": "constant",
        "dpo": "constant",
        "grpo": "constant",
    }
    sft = resolve_schedule(objective_named("sft"), lr=3e-3, max_steps=20)
    assert [sft.lr(k) for k in (1, 10, 20)] == [3e-3, 3e-3, 3e-3]
    assert sft.summary() == "constant lr 0.003"
    pretrain = resolve_schedule(objective_named("pretrain"), lr=3e-3, max_steps=20)
    assert (pretrain.decay, pretrain.warmup_steps, pretrain.floor) == ("cosine", 0, 3e-3 / 10)
    assert pretrain.lr(20) == pytest.approx(3e-4)
    asked = resolve_schedule(
        objective_named("dpo"), lr=1e-3, max_steps=10, lr_schedule="linear", warmup_steps=20
    )
    assert (asked.decay, asked.warmup_steps) == ("linear", 10)  # at most the run's steps


def test_an_objective_of_one_s_own_declares_its_default() -> None:
    def loss(xp: object, inputs: object, settings: object) -> LossTerms:
        raise NotImplementedError

    decaying = Objective(
        name="decaying", summary="a test", data=DataKind.CONVERSATIONS, loss=loss,
        items=supervised_tokens, lr_schedule="linear",
    )  # fmt: skip
    schedule = resolve_schedule(decaying, lr=1e-3, max_steps=10)
    assert (schedule.decay, schedule.lr(10)) == ("linear", pytest.approx(1e-4))
    held = resolve_schedule(
        Objective(name="held", summary="a test", data=DataKind.CONVERSATIONS, loss=loss,
                  items=supervised_tokens),
        lr=1e-3, max_steps=10,
    )  # fmt: skip
    assert held.decay == "constant"  # a declaration's default: the rate held


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"lr_schedule": "step"}, "--lr-schedule 'step': use one of constant, linear, cosine"),
        ({"warmup_steps": -1}, "--warmup-steps -1: must be 0 or more"),
        ({"min_lr": 1.0}, "--min-lr 1 must be between 0 and --lr (0.001)"),
    ],
)
def test_bad_flags_are_one_line(flags: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as error:
        resolve_schedule(objective_named("pretrain"), lr=1e-3, max_steps=10, **flags)  # type: ignore[arg-type]
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_lambda_factor_keeps_plain_numbers_and_its_shape_is_its_class() -> None:
    for decay, cls in (("constant", ConstantFactor), ("linear", LinearFactor),
                       ("cosine", CosineFactor)):  # fmt: skip
        shape = LRSchedule(1.0, 0.1, 2, 10, decay)
        factor = EpochFactor.of(shape)
        assert type(factor) is cls and factor.schedule == shape
        assert vars(factor) == {"peak": 1.0, "floor": 0.1, "warmup_steps": 2, "total_steps": 10}
        assert [factor(epoch) for epoch in range(12)] == [shape.lr(k) for k in range(1, 13)]


def test_resume_lines_of_the_other_shapes() -> None:
    constant = LRSchedule(1e-3, 1e-4, 2, 30, "constant")
    assert constant.resume_line(20) == "resuming at step 20 of 30: lr stays at 0.001"
    linear = LRSchedule(1e-3, 1e-4, 2, 30, "linear")
    assert linear.resume_line(20).startswith(
        "resuming at step 20 of 30: linear decay continues from lr 0.000389 to 0.0001"
    )
