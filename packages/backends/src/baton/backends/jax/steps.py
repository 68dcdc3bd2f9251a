"""The JAX backend's jitted train step, and its variants for callbacks on the model.

``train_step(state, batch) -> (state, (loss, metrics))`` is the plain step every run
compiles. A callback that touches the model (``model_state.py``) makes the backend
compile a variant once, with what it asked for, taking a third argument of controls
held as data (so changing them never recompiles):

- ``grads``: the step also returns the gradients (before any clipping in the user's
  optax chain and before the update), for gradient watchers;
- ``masked``: ``controls["trainable"]`` (one boolean per parameter, shaped like the
  parameters' tree) zeroes the gradients of frozen parameters before the optimizer
  (so a global-norm clip ignores them) and keeps their values and their optimizer
  state (every optimizer-state subtree shaped like the parameters) as they were;
- ``scaled``: ``controls["lr_scale"]`` multiplies the optimizer's updates (for optax
  optimizers whose update is ``-lr x direction``, Adam(W), SGD, Lion..., the same as
  multiplying the learning rate).

Example::

    step = make_train_step(split, optax.adam(1e-3), loss_of, grads=True, masked=True)
    state, (loss, metrics), grads = step(state, batch, {"trainable": mask})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class LossFunctionError(TypeError):
    """``loss_fn`` returned something other than a scalar loss or ``(loss, metrics)``."""


def make_train_step(
    split: Any,
    tx: Any,
    loss_of: Callable[[Any, Any], tuple[Any, dict[str, Any]]],
    *,
    grads: bool = False,
    masked: bool = False,
    scaled: bool = False,
) -> Callable[..., Any]:
    """The (unjitted) train step: plain without options, else the variant taking
    controls and returning the gradients too (an empty dict unless ``grads``)."""
    import jax
    import jax.numpy as jnp
    import optax

    variant = grads or masked or scaled

    def step(state: dict[str, Any], batch: Any, controls: dict[str, Any] | None = None) -> Any:
        params = state["params"]
        (loss, aux), gradients, rest = split.value_and_grad(
            lambda model: loss_of(model, batch), params, state["rest"]
        )
        shown = gradients
        if masked:
            trainable = controls["trainable"] if controls else None
            gradients = jax.tree.map(
                lambda t, g: jnp.where(t, g, jnp.zeros_like(g)), trainable, gradients
            )
        updates, opt_state = tx.update(gradients, state["opt_state"], params)
        if scaled:
            scale = controls["lr_scale"] if controls else 1.0
            updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
        new_params = optax.apply_updates(params, updates)
        if masked:
            trainable = controls["trainable"] if controls else None
            new_params = keep_frozen(trainable, new_params, params)
            opt_state = keep_frozen_subtrees(trainable, opt_state, state["opt_state"], params)
        new_state = {
            "params": new_params,
            "rest": rest,
            "opt_state": opt_state,
            "step": state["step"] + 1,
        }
        if not variant:
            return new_state, (loss, aux)
        return new_state, (loss, aux), (shown if grads else {})

    return step


def keep_frozen(trainable: Any, new: Any, old: Any) -> Any:
    """``new`` where trainable, ``old`` where frozen (trees shaped like the parameters)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda t, n, o: jnp.where(t, n, o), trainable, new, old)


def keep_frozen_subtrees(trainable: Any, new_state: Any, old_state: Any, params: Any) -> Any:
    """The optimizer state with every subtree shaped like the parameters (Adam's ``mu``
    and ``nu``, momentum) kept at its old value for frozen parameters; other leaves
    (step counts) as updated."""
    import jax

    structure = jax.tree.structure(params)

    def like_params(node: Any) -> bool:
        return jax.tree.structure(node) == structure

    return jax.tree.map(
        lambda n, o: keep_frozen(trainable, n, o) if like_params(n) else n,
        new_state,
        old_state,
        is_leaf=like_params,
    )


def loss_and_metrics(out: Any) -> tuple[Any, dict[str, Any]]:
    """Split what a loss function returned into a scalar loss and a dict of scalars
    (checked while tracing: no cost per step)."""
    import jax.numpy as jnp

    if isinstance(out, tuple):
        if len(out) != 2 or not isinstance(out[1], Mapping):
            raise LossFunctionError(
                "loss_fn must return a scalar loss or (loss, {name: scalar}); it returned a "
                f"tuple of {len(out)} ({', '.join(type(o).__name__ for o in out)})"
            )
        loss, aux = out
    else:
        loss, aux = out, {}
    if (
        not hasattr(loss, "shape")
        or jnp.shape(loss) != ()
        or not jnp.issubdtype(jnp.result_type(loss), jnp.floating)
    ):
        shape = getattr(loss, "shape", None)
        raise LossFunctionError(
            f"loss_fn must return a scalar floating loss, got {type(loss).__name__} with shape "
            f"{shape}; reduce it (e.g. .mean()) and return (loss, metrics) for more values"
        )
    for key, value in aux.items():
        if jnp.shape(value) != ():
            raise LossFunctionError(
                f"loss_fn's metric {key!r} has shape {jnp.shape(value)}; metrics must be "
                "scalars (reduce them in the loss function)"
            )
    return loss, dict(aux)
