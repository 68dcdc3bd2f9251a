"""The user's flax model as (parameters, other state) plus a way to rebuild it in a step.

- ``nnx``: an ``nnx.Module`` (or a zero-argument factory returning one). The parameters
  are its ``nnx.Param`` variables; everything else (batch statistics, RNG counters) is
  carried through the step and updated from what the loss function left in the module.
- ``linen``: a ``flax.linen.Module`` with its initial ``variables`` (the dict
  ``module.init`` returned). The loss function receives the module bound to them
  (``module.bind(variables)``), so ``model(x)`` works; only the ``params`` collection is
  trained, other collections are read-only.

Example::

    split = split_model(model)                      # nnx
    split = split_model(mlp, variables=variables)   # linen
    params, rest = split.params, split.rest
    model = split.merge(params, rest)               # inside a jitted function
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class SplitModel:
    """A model taken apart into trainable ``params`` and other ``rest`` state."""

    kind: str
    params: Any
    rest: Any
    #: ``merge(params, rest)``: the model again (inside a jitted function)
    merge: Callable[[Any, Any], Any]
    #: ``value_and_grad(loss_of, params, rest) -> ((loss, aux), grads, new_rest)`` where
    #: ``loss_of(model) -> (loss, aux)``; the gradient is taken with respect to ``params``
    value_and_grad: Callable[[Callable[[Any], Any], Any, Any], tuple[Any, Any, Any]]


def split_model(model: Any, variables: Any = None) -> SplitModel:
    """Take an nnx module (or factory) or a linen module with ``variables`` apart."""
    import jax
    from flax import linen, nnx

    if isinstance(model, linen.Module):
        if variables is None:
            raise ValueError(
                "a flax.linen model needs its variables: pass variables=module.init(key, x)"
            )
        params = variables["params"]
        rest = {k: v for k, v in variables.items() if k != "params"}

        def merge_linen(p: Any, r: Any) -> Any:
            return model.bind({"params": p, **r})

        def linen_value_and_grad(loss_of: Any, p: Any, r: Any) -> tuple[Any, Any, Any]:
            out, grads = jax.value_and_grad(lambda q: loss_of(merge_linen(q, r)), has_aux=True)(p)
            return out, grads, r

        return SplitModel("linen", params, rest, merge_linen, linen_value_and_grad)
    if not isinstance(model, nnx.Module) and callable(model):
        model = model()
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"model must be an nnx.Module, a factory returning one, or a flax.linen.Module "
            f"with variables=...; got {type(model).__name__}"
        )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def merge_nnx(p: Any, r: Any) -> Any:
        return nnx.merge(graphdef, p, r)

    def nnx_value_and_grad(loss_of: Any, p: Any, r: Any) -> tuple[Any, Any, Any]:
        # nnx's own transform: the module's non-parameter state (RNG counters, batch
        # statistics) may change inside the loss, which plain jax.grad does not allow
        merged = merge_nnx(p, r)
        out, grads = nnx.value_and_grad(loss_of, has_aux=True)(merged)
        return out, grads, nnx.split(merged, nnx.Param, ...)[2]

    return SplitModel("nnx", params, rest, merge_nnx, nnx_value_and_grad)
