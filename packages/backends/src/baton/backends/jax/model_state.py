"""The JAX backend's ``ModelState``: the user's flax parameters by name, their
gradients, the learning rate and freezing, for callbacks written once for every backend.

- Names: the parameters' flax paths joined by dots (nnx ``blocks.0.attn.out.kernel``,
  linen ``Dense_0.kernel``). Each ``Piece.value`` is the global ``jax.Array`` (its
  ``index`` covers the whole tensor, ``counted`` is true: a JAX computation on it is
  already over every device), valid until the next step (the step donates the state:
  keep a copy, ``xp.asarray(value, copy=True)``, to hold it longer).
- ``watch_gradients``: the first watcher makes the backend compile a step that also
  returns the gradients (``steps.py``): before any clipping in the user's optax chain and
  before the update; frozen parameters are left out.
- ``freeze``/``unfreeze``: a mask of one boolean per parameter, passed to the step as
  data (toggling it never recompiles): a frozen parameter's gradient is zeroed before the
  optimizer (a global-norm clip ignores it) and its value and optimizer state are kept.
  The mask is not in the checkpoint: the ``Freeze`` callback's state restores it.
- ``set_hyperparameter("lr", x)``: from the next step the optimizer's updates are scaled
  by ``x / current`` where ``current`` is ``lr_schedule(step) x scale`` (the schedule the
  backend was given, ``JaxConfig.lr_schedule``; without it the learning rate is unknown
  and setting it is refused). Later steps follow the schedule times that scale, so the
  schedule continues from the value set; the scale is saved with the data position and
  restored on resume, and the logged ``lr`` includes it. Weight decay lives inside the
  user's optax chain: it is reported as ``nan`` and setting it is refused.
- ``sum_over_ranks`` returns its input: values computed on global arrays are already
  sums over every device and process.
- ``save_arrays``: process 0 writes every array whole (``arrays-rank0.safetensors``);
  ``load_arrays`` reads it on every process and places each array like its parameter.

Example::

    state = backend.model_state()   # JaxModelState(lambda: engine.state, controls, ...)
    state.freeze(["embed.*", "blocks.0.*"])
    state.watch_gradients(lambda grads: ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.backends.jax.progress import TrainProgress
from baton.backends.jax_arrays import load_whole_arrays, save_whole_arrays
from baton.backends.jax_distributed import fetch
from baton.core.model_state import Hyperparameter, OptimizerGroup, Piece, matches


def path_name(path: Sequence[Any]) -> str:
    """``blocks.0.attn.kernel`` from a pytree key path (an nnx variable's trailing
    ``.value`` dropped)."""
    parts: list[str] = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    if len(parts) > 1 and parts[-1] == "value" and type(path[-1]).__name__ == "GetAttrKey":
        parts.pop()
    return ".".join(parts)


class StepControls:
    """What callbacks asked of the step: gradient watchers, frozen names, an lr scale.

    ``variant`` is the compiled step's options (``None``: the plain step, nothing asked);
    ``arguments(params)`` the controls passed to it as data (cached on the device until
    they change)."""

    def __init__(self) -> None:
        self.watchers: list[Callable[[Mapping[str, Any]], None]] = []
        self.frozen: set[str] = set()
        self.masked = False
        self.lr_scale = 1.0
        self.scaled = False
        self.variant: tuple[bool, bool, bool] | None = None
        self._arguments: dict[str, Any] | None = None

    def changed(self) -> None:
        """Call after changing what is asked: the variant and its controls are renewed."""
        key = (bool(self.watchers), self.masked, self.scaled)
        self.variant = key if any(key) else None
        self._arguments = None

    def arguments(self, params: Any) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        if self._arguments is None:
            arguments: dict[str, Any] = {}
            if self.masked:
                names = iter(param_names(params))
                arguments["trainable"] = jax.tree.map(
                    lambda _: jnp.asarray(next(names) not in self.frozen), params
                )
            if self.scaled:
                arguments["lr_scale"] = jnp.asarray(self.lr_scale, jnp.float32)
            self._arguments = arguments
        return self._arguments

    def show(self, gradients: Any) -> None:
        """Call the watchers with ``{name: gradient}`` of the trainable parameters."""
        shown = {name: grad for name, grad in named_leaves(gradients) if name not in self.frozen}
        for watcher in self.watchers:
            watcher(shown)


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    import jax

    return [(path_name(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def param_names(tree: Any) -> list[str]:
    return [name for name, _ in named_leaves(tree)]


class JaxModelState:
    """``baton.core.model_state.ModelState`` over a JAX train state.

    ``state`` returns the engine's current train state (a dict with ``params``; each
    step replaces it); ``controls`` is what the engine's step applies; ``lr_schedule``
    the schedule given to the optimizer (``None``: unknown); ``progress`` the engine's
    step count (the schedule's argument).
    """

    def __init__(
        self,
        state: Callable[[], dict[str, Any] | None],
        controls: StepControls,
        lr_schedule: Callable[[Any], Any] | None,
        progress: TrainProgress,
    ) -> None:
        self._state = state
        self.controls = controls
        self._lr_schedule = lr_schedule
        self._progress = progress

    def _train_state(self) -> dict[str, Any]:
        state = self._state()
        assert state is not None, "model_state() is available after setup"
        return state

    @property
    def _params(self) -> Any:
        return self._train_state()["params"]

    def parameters(self, patterns: str | Sequence[str] = "*") -> list[Piece]:
        return [
            Piece(
                name=name,
                value=value,
                global_shape=tuple(value.shape),
                index=tuple(slice(0, n) for n in value.shape),
                frozen=name in self.controls.frozen,
            )
            for name, value in named_leaves(self._params)
            if matches(name, patterns)
        ]

    def watch_gradients(self, watcher: Callable[[Mapping[str, Any]], None]) -> None:
        self.controls.watchers.append(watcher)
        self.controls.changed()

    def sum_over_ranks(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return dict(values)

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        return fetch(values)

    # -- the optimizer ---------------------------------------------------------------
    def _current_lr(self) -> float:
        schedule = self._lr_schedule
        if schedule is None:
            return math.nan
        return float(schedule(self._progress.steps_done)) * self.controls.lr_scale

    def optimizer_groups(self) -> list[OptimizerGroup]:
        names = tuple(param_names(self._params))
        return [OptimizerGroup(index=0, lr=self._current_lr(), weight_decay=math.nan, names=names)]

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        if groups is not None and list(groups) != [0]:
            raise ValueError(f"the JAX backend has one optimizer group (0), not {list(groups)}")
        if name != "lr":
            raise ValueError(
                f"the JAX backend cannot set {name!r}: it lives inside your optax chain; "
                "build the optimizer with that value (only 'lr' can be set)"
            )
        current = self._current_lr()
        if math.isnan(current):
            raise ValueError(
                "the JAX backend knows the learning rate from lr_schedule: pass "
                "JaxBackend(lr_schedule=...) (the schedule given to optax, or lambda step: lr)"
            )
        if current == 0.0:
            raise ValueError(
                f"the learning rate is 0 at step {self._progress.steps_done}: it cannot be "
                "scaled to a new value; set it once the schedule is above 0"
            )
        self.controls.lr_scale *= value / current
        self.controls.scaled = True
        self.controls.changed()

    # -- freezing and writing ----------------------------------------------------------
    def _names(self, patterns: str | Sequence[str]) -> list[str]:
        return [name for name in param_names(self._params) if matches(name, patterns)]

    def freeze(self, patterns: str | Sequence[str]) -> list[str]:
        names = self._names(patterns)
        self.controls.frozen.update(names)
        self.controls.masked = True
        self.controls.changed()
        return names

    def unfreeze(self, patterns: str | Sequence[str]) -> list[str]:
        names = self._names(patterns)
        self.controls.frozen.difference_update(names)
        self.controls.changed()
        return names

    def assign(self, values: Mapping[str, Any]) -> None:
        import jax
        import jax.numpy as jnp

        state = self._train_state()
        leaves, treedef = jax.tree_util.tree_flatten_with_path(self._params)
        known = {path_name(path) for path, _ in leaves}
        unknown = sorted(set(values) - known)
        if unknown:
            raise KeyError(
                f"no parameters named {unknown[:3]} (the model has {sorted(known)[:3]}...)"
            )
        new = []
        for path, old in leaves:
            name = path_name(path)
            if name not in values:
                new.append(old)
                continue
            value = values[name]
            if tuple(value.shape) != tuple(old.shape):
                raise ValueError(
                    f"{name}: shape {tuple(value.shape)} does not fit {tuple(old.shape)}"
                )
            new.append(jax.device_put(jnp.asarray(value, dtype=old.dtype), old.sharding))
        state["params"] = jax.tree_util.tree_unflatten(treedef, new)

    def save_arrays(self, directory: Path, arrays: Mapping[str, Any]) -> None:
        save_whole_arrays(directory, arrays, {p.name: p for p in self.parameters()})

    def load_arrays(self, directory: Path) -> dict[str, Any]:
        return load_whole_arrays(directory, {p.name: p for p in self.parameters()})
