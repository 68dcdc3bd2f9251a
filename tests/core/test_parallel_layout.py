"""The parallel layout's divisibility, each refusal naming the quantity that does not divide."""

from __future__ import annotations

import pytest

from baton.core.errors import UsageError
from baton.core.model.parallel_layout import check_parallel_layout, divisors


def test_a_layout_that_divides_the_model_passes():
    check_parallel_layout(heads=32, kv_heads=8, layers=32, experts=64, tp=8, pp=4, vpp=2, ep=8)
    check_parallel_layout(heads=32, layers=None, tp=1, pp=3)  # layers split unevenly: unchecked


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (dict(heads=32, kv_heads=8, tp=3), "--tp 3 does not divide the model's 32 attention heads"),
        (
            dict(heads=32, kv_heads=8, tp=16),
            "--tp 16 does not divide the model's 8 key/value heads",
        ),
        (
            dict(layers=2, pp=3),
            "--pp 3 does not divide the model's 2 layers; use a --pp that divides 2: 1, 2",
        ),
        (
            dict(layers=32, pp=4, vpp=3),
            "--pp 4 x --vpp 3 model chunks do not divide the model's 32 layers",
        ),
        (dict(experts=64, ep=6), "--ep 6 does not divide the model's 64 experts"),
    ],
)
def test_each_refusal_names_its_quantity(layout, message):
    with pytest.raises(UsageError) as error:
        check_parallel_layout(**layout)
    assert message in str(error.value)
    assert error.value.exit_status == 2


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
