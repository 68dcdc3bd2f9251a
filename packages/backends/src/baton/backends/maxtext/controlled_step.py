"""MaxText's own jitted ``train_step`` with baton's controls: the gradients before
clipping shown, parameters frozen, the learning rate and weight decay changed, all as
data (changing them never recompiles).

The step runs ``train.train_step`` unchanged on the train state whose optax optimizer
is wrapped (``controlled_optimizer``). Two kinds, each compiled on first use:

- watching only (no adjustment asked yet): MaxText's program exactly, plus the raw
  gradients as an extra output. MaxText clips inside ``train_step`` with
  ``maxtext_utils.apply_gradient_clipping``; while the step is traced,
  ``raw_gradients_shown`` passes that function's input on (the optimizer sees the raw
  gradients itself when clipping is off). The losses and weights stay bitwise
  MaxText's (the test checks it): on XLA any added arithmetic, even a multiplication
  by 1, changes the fusion and the last bits of the result.
- adjusting (something was frozen, or a learning rate or weight decay set): the
  clipping moves into the optimizer (``train_step`` runs on a copy of the config with
  ``gradient_clipping_threshold: 0``), which zeroes the gradients of frozen parameters
  (they count in no norm), clips with ``optax.clip_by_global_norm(threshold)`` (what
  MaxText's clipping applies; the ``learning/grad_norm`` metric is the clipped norm
  again), runs MaxText's optimizer, scales its updates by ``lr_scale`` (what scaling
  the schedule's learning rate does to SGD, Adam and AdamW, decoupled weight decay
  included), adds ``-lr * lr_scale * decay_delta * param`` for a changed AdamW weight
  decay (on the parameters MaxText's ``adamw_mask`` decays), and keeps frozen
  parameters' updates at zero and their optimizer state unchanged
  (``optax.tree_map_params`` finds the copies of the parameter tree in the state; a
  shared count, as Adam's, still advances).

A frozen mask is one boolean per parameter array, shaped to broadcast over it: for an
array of scanned layers ``[1, layers, 1, ...]``, so each layer freezes on its own.

Example::

    step = controlled_train_step(parts, gradient_of, adjusts=True, decays=False,
                                 donate=True)            # parts: step_parts.StepParts
    state, metrics, grads = step(state, batch, controls)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from baton.backends.maxtext.step_parts import StepParts


def path_key(path: Any) -> str:
    """A tree path as ``decoder/layers/mlp/wi_0/kernel`` (the key of a frozen mask)."""
    import jax

    return jax.tree_util.keystr(path, simple=True, separator="/")


def controlled_optimizer(
    inner: Any,
    controls: Mapping[str, Any],
    threshold: float,
    decay: tuple[Any, Any] | None,
    shown: dict[str, Any],
    *,
    adjusts: bool,
) -> Any:
    """``inner`` (an optax transformation) under ``controls``. Without ``adjusts`` it
    only notes the gradients it gets (the raw ones when MaxText does not clip);
    otherwise it clips at ``threshold`` itself and applies the controls. ``decay`` is
    this step's learning rate and MaxText's weight-decay mask function (``None``: no
    change of weight decay)."""
    import jax
    import jax.numpy as jnp
    import optax

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        shown.setdefault("raw", grads)
        if not adjusts:
            return inner.update(grads, state, params, **extra)
        trainable = jax.tree_util.tree_map_with_path(
            lambda path, _: controls["trainable"][path_key(path)], grads
        )
        grads = jax.tree.map(lambda g, keep: jnp.where(keep, g, 0), grads, trainable)
        if threshold > 0:
            clip = optax.clip_by_global_norm(threshold)
            grads, _ = clip.update(grads, clip.init(grads))
            shown["clipped_norm"] = optax.tree.norm(grads)
        updates, new_state = inner.update(grads, state, params, **extra)
        if decay is not None:
            lr, mask_fn = decay
            decays = (
                mask_fn(params) if mask_fn is not None else jax.tree.map(lambda _: True, params)
            )
            step = lr * controls["decay_delta"]
            updates = jax.tree.map(
                lambda u, p, on: u - step * p if on else u, updates, params, decays
            )
        scale = controls["lr_scale"]
        updates = jax.tree.map(lambda u, keep: jnp.where(keep, u * scale, 0), updates, trainable)
        masks = optax.tree_utils.tree_map_params(
            inner, lambda _, keep: keep, new_state, trainable, transform_non_params=lambda _: None
        )
        new_state = jax.tree.map(
            lambda keep, new, old: new if keep is None else jnp.where(keep, new, old),
            masks,
            new_state,
            state,
            is_leaf=lambda x: x is None,
        )
        return updates, new_state

    return optax.GradientTransformationExtraArgs(inner.init, update)


@contextlib.contextmanager
def raw_gradients_shown(shown: dict[str, Any]) -> Iterator[None]:
    """While ``train_step`` is traced: MaxText's ``apply_gradient_clipping`` notes the
    raw gradients it clips in ``shown["raw"]`` (a pure dict), then clips as before."""
    from flax import nnx
    from maxtext.utils import maxtext_utils

    clipping = maxtext_utils.apply_gradient_clipping

    def noting(raw_grads: Any, state: Any, threshold: float) -> Any:
        pure = raw_grads.to_pure_dict() if isinstance(raw_grads, nnx.State) else raw_grads
        shown["raw"] = pure
        return clipping(raw_grads, state, threshold)

    maxtext_utils.apply_gradient_clipping = noting
    try:
        yield
    finally:
        maxtext_utils.apply_gradient_clipping = clipping


def clipping_in_optimizer(hparams: Any) -> Any:
    """A copy of MaxText's config with ``gradient_clipping_threshold`` 0 (the controlled
    optimizer clips instead)."""
    moved = copy.deepcopy(hparams)
    moved.get_keys()["gradient_clipping_threshold"] = 0.0  # HyperParameters' own values
    return moved


def controlled_train_step(
    parts: StepParts,
    gradient_of: Mapping[str, Callable[[Any], Any]] | None,
    *,
    adjusts: bool,
    decays: bool,
    donate: bool,
) -> Callable[..., Any]:
    """The jitted controlled step of a set-up MaxText run (``parts``):
    ``step(state, batch, controls) -> (state, metrics, {name: gradient})``.

    ``gradient_of`` maps each name to the function from MaxText's gradient tree to that
    tensor's gradient (``None``: no gradients returned); ``adjusts``: apply the
    controls (freezing, ``lr_scale``); ``decays``: apply ``controls["decay_delta"]``;
    ``donate``: donate the state as MaxText's step does.
    """
    import jax
    from flax import nnx
    from maxtext.optimizers.optimizers import get_adamw_mask
    from maxtext.trainers.pre_train import train
    from maxtext.utils import sharding

    hparams, graphdef = parts.hparams, parts.graphdef
    state_shardings, params_shardings = parts.state_shardings, parts.params_shardings
    threshold = float(hparams.gradient_clipping_threshold)
    config = clipping_in_optimizer(hparams) if adjusts else hparams
    schedule = parts.learning_rate_schedule
    mask_fn = get_adamw_mask(hparams)

    def step(state: Any, batch: Any, controls: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        train_state = nnx.merge(graphdef, state)
        shown: dict[str, Any] = {}
        decay = (schedule(state["optimizer"]["step"].get_value()), mask_fn) if decays else None
        train_state.optimizer.tx = controlled_optimizer(
            train_state.optimizer.tx, controls, threshold, decay, shown, adjusts=adjusts
        )
        wrapped, same_state = nnx.split(train_state)
        with raw_gradients_shown(shown):
            new_state, metrics = train.train_step(
                wrapped, config, state_shardings, params_shardings, same_state, batch
            )
        if "clipped_norm" in shown:
            metrics["scalar"]["learning/grad_norm"] = shown["clipped_norm"]
        grads: dict[str, Any] = {}
        if gradient_of is not None:
            grads = {name: gradient(shown["raw"]) for name, gradient in gradient_of.items()}
        return new_state, metrics, grads

    data_sharding = sharding.get_input_data_sharding(
        hparams, parts.mesh, rules=hparams.logical_axis_rules
    )
    return jax.jit(
        step,
        in_shardings=(state_shardings, data_sharding, None),
        out_shardings=(state_shardings, None, None),
        donate_argnums=(0,) if donate else (),
    )
