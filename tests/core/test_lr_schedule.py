"""The one schedule shape: its rates at the edges and what a resume line says."""

from __future__ import annotations

import math

import pytest

from baton.core.lr_schedule import EpochFactor, WarmupCosine

SHAPE = WarmupCosine(peak=1e-3, floor=1e-4, warmup_steps=2, total_steps=30)


def test_warmup_peak_and_floor() -> None:
    assert [SHAPE.lr(k) for k in (1, 2)] == pytest.approx([5e-4, 1e-3])
    assert SHAPE.lr(16) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert SHAPE.lr(30) == SHAPE.lr(40) == 1e-4


def test_resume_lines_say_what_follows() -> None:
    assert SHAPE.resume_line(20) == (
        "resuming at step 20 of 30: cosine decay continues from lr 0.000311 to 0.0001 at step 30"
    )
    assert SHAPE.resume_line(1).startswith("resuming at step 1 of 30: warmup continues from")
    assert SHAPE.resume_line(30) == "resuming at step 30 of 30: lr stays at the floor 0.0001"


def test_a_lambda_factor_is_the_next_steps_rate_over_the_peak() -> None:
    factor = EpochFactor.of(SHAPE.scaled(1 / SHAPE.peak))
    assert factor(19) == pytest.approx(SHAPE.lr(20) / SHAPE.peak)
    assert factor.__dict__ == {"peak": 1.0, "floor": pytest.approx(0.1), "warmup_steps": 2,
                               "total_steps": 30}  # fmt: skip


def test_no_warmup_starts_on_the_cosine() -> None:
    shape = WarmupCosine(peak=1.0, floor=0.0, warmup_steps=0, total_steps=4)
    assert [shape.lr(k) for k in range(0, 5)] == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    )
