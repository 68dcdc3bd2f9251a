"""Callbacks and checks that any engine's tests use to show a post-training run still
rolls back, freezes and averages as pretraining does.

    rollback = RollbackOnce(at_step=5, to_step=2)   # at step 5's start, back to step 2
    metrics, weights = LoggedMetrics(), StepWeights()
    driver.callbacks += [Freeze(["model.layers.0.*"]), EMA(decay=0.5), metrics, weights]
    driver.fit()
    check_frozen(weights, ["model.layers.0.*"])
    check_ema(weights, ema.averages, decay=0.5)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from baton.core import Callback
from baton.core.model_state import matches
from support.posttrain import LoggedMetrics

__all__ = [
    "LoggedMetrics",
    "RollbackOnce",
    "StepWeights",
    "check_ema",
    "check_frozen",
    "check_replayed",
]


class RollbackOnce(Callback):
    """At the start of step ``at_step`` go back (``driver.rollback``, as ``LossGuard``
    and ``CorruptionCheck`` do) to the checkpoint of step ``to_step``, once."""

    def __init__(self, at_step: int, to_step: int) -> None:
        self.at_step, self.to_step, self.done = at_step, to_step, False

    def on_step_start(self, driver: Any) -> None:
        if driver.step + 1 == self.at_step and not self.done:
            self.done = True
            driver.rollback(driver.checkpoint_dir / f"step_{self.to_step:06d}")


def _host(value: Any) -> np.ndarray:
    """A copy on the host of a torch or JAX array, as numpy."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy().copy()
    return np.array(value, copy=True)


class StepWeights(Callback):
    """Every parameter (the ``model_state`` names) at the start of training and after
    every step, on the host: ``values[step][name]`` (step 0: the starting weights)."""

    def __init__(self) -> None:
        self.values: dict[int, dict[str, np.ndarray]] = {}

    def _take(self, driver: Any) -> None:
        pieces = driver.backend.model_state().parameters()
        self.values[driver.step] = {p.name: _host(p.value) for p in pieces}

    def on_train_start(self, driver: Any) -> None:
        self._take(driver)

    def on_step_end(self, driver: Any, output: Any) -> None:
        self._take(driver)


def check_frozen(weights: StepWeights, patterns: list[str]) -> list[str]:
    """The parameters matching ``patterns`` stayed bitwise as they started through every
    step; every other one changed at each step. Returns the frozen names."""
    steps = sorted(weights.values)
    start = weights.values[steps[0]]
    frozen = [n for n in start if any(matches(n, p) for p in patterns)]
    assert frozen and len(frozen) < len(start), (frozen, list(start))
    for step in steps[1:]:
        now, before = weights.values[step], weights.values[step - 1]
        for name in frozen:
            assert np.array_equal(now[name], start[name]), f"{name} moved at step {step}"
        for name in set(start) - set(frozen):
            assert not np.array_equal(now[name], before[name]), f"{name} still at step {step}"
    return frozen


def check_ema(weights: StepWeights, averages: dict[str, Any], decay: float) -> None:
    """``averages`` equal the average computed here from the weights after each step
    (the first step's weights, then ``decay * average + (1 - decay) * weights``), in
    the weights' own precision."""
    steps = sorted(s for s in weights.values if s > 0)
    expected = dict(weights.values[steps[0]])
    for step in steps[1:]:
        for name, value in weights.values[step].items():
            dtype = value.dtype
            expected[name] = (expected[name] * dtype.type(decay)).astype(dtype) + (
                value * dtype.type(1.0 - decay)
            ).astype(dtype)
    assert set(averages) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(_host(averages[name]), value, rtol=1e-6, atol=1e-7, err_msg=name)


def check_replayed(
    straight: LoggedMetrics,
    replayed: LoggedMetrics,
    straight_weights: StepWeights,
    replayed_weights: StepWeights,
    keys: list[str],
) -> None:
    """A run rolled back at step 5 to step 2 (:class:`RollbackOnce`) logged steps 3 and 4
    twice, and every step's ``keys`` and the final weights equal the straight run's, bit
    for bit; the straight run's six losses all differ (each step read other rows)."""
    assert [step for step, _ in replayed.logged] == [1, 2, 3, 4, 3, 4, 5, 6]
    want, got = straight.metrics, replayed.metrics
    for step in range(1, 7):
        assert [got[step][k] for k in keys] == [want[step][k] for k in keys], step
    assert len({want[step]["loss"] for step in range(1, 7)}) == 6
    last = max(straight_weights.values)
    for name, value in straight_weights.values[last].items():
        assert np.array_equal(replayed_weights.values[last][name], value), name
