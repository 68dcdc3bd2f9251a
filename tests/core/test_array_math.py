"""The objectives' shared array math has the same gradients on torch and JAX, at the
points where a formula's subgradients differ between frameworks (DPO starts at a
log-ratio of exactly 0: the policy is the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baton.core.objectives.array_math import softplus

POINTS = [-30.0, -1.0, 0.0, 1e-3, 2.0, 30.0]


def sigmoid(x: float) -> float:
    return float(1 / (1 + np.exp(-x)))


def test_softplus_gradient_is_the_sigmoid_on_torch() -> None:
    values = torch.tensor(POINTS, requires_grad=True)
    softplus(torch, values).sum().backward()
    assert values.grad is not None
    assert values.grad.tolist() == pytest.approx([sigmoid(x) for x in POINTS], rel=1e-6)


def test_softplus_gradient_is_the_sigmoid_on_jax() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    grads = jax.grad(lambda v: softplus(jnp, v).sum())(jnp.asarray(POINTS, dtype=jnp.float32))
    assert np.asarray(grads).tolist() == pytest.approx([sigmoid(x) for x in POINTS], rel=1e-6)


def test_softplus_values_equal_log1p_exp() -> None:
    values = np.asarray(POINTS, dtype=np.float64)
    assert softplus(np, values) == pytest.approx(np.log1p(np.exp(values)), rel=1e-12)
