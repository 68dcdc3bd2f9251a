"""MaxText's ``model_state`` ability (``baton.core.model_state``): the model's parameters
by name, the gradients before clipping, the optimizer's learning rate and weight decay,
and freezing, for a callback written once for every backend.

Names: a scanned MaxText Llama or dense Qwen3 (what ``--init-from`` / ``--model-config``
build) shows the Hugging Face names; each layer's tensor is a ``Piece`` computed from the
array of stacked layers (``Piece.fused`` names it, e.g. ``decoder.layers.self_attention.query.
kernel``) in Hugging Face's layout (``hf_views``). Any other MaxText model shows its own
dotted paths, each array whole. JAX arrays are global: every piece is the whole tensor
(``index`` covers it, ``counted`` is true) and ``sum_over_ranks`` returns its values
unchanged (a sum over a global array already spans every device and process).

Nothing changes on a step until a callback asks: the first ``watch_gradients``,
``freeze`` or ``set_hyperparameter`` switches the backend to MaxText's ``train_step``
under baton's controls (``controlled_step``, compiled once per kind: gradients shown
or not, adjusting or not, a weight decay change or not). Watching alone keeps the
losses and weights bitwise MaxText's. The first ``freeze`` or ``set_hyperparameter``
compiles the adjusting step once (MaxText's clipping moves into the optimizer); after
that freezing, unfreezing and new values are data, never a recompile. Gradients reach
the watchers after the step returns (JAX computes the step as one program), as they
were before clipping; frozen names are left out.

MaxText's ``skip_step_on_spikes`` cannot run with freezing or a hyperparameter set
(its spike test would read the unclipped norm once the clipping moves): refused then.

Per hyperparameter:

- ``lr``: a factor on MaxText's schedule, ``value / schedule(step)`` at the step it is
  set, applied to the optimizer's updates; the schedule continues from the value set
  (every later step's learning rate is the schedule's times that factor). The ``lr``
  metric the backend logs is the scaled one. Setting it while the schedule is 0 (the
  first warmup step) is refused.
- ``weight_decay`` (AdamW only): the difference to the configured decay is applied as
  ``-lr * delta * param`` on the parameters MaxText decays (``adamw_mask``).
- Freezing a parameter keeps it and its optimizer moments bitwise unchanged; its
  gradient is zeroed before clipping (it counts in no norm). A frozen layer of a
  stacked array freezes alone (the mask is per layer).

The factor, the decay and the frozen names are not in MaxText's checkpoint: the
checkpoint I/O records the factor and the decay in ``hyperparameters.json`` (through
``TrainSteps.hyperparameters_set``) and restores them on resume; the ``Freeze``
callback keeps its own schedule.

Example::

    state = backend.model_state()      # MaxTextModelState(lambda: engine.state, parts)
    state.freeze("model.layers.0.*")
    state.set_hyperparameter("lr", 1e-4)
    state.watch_gradients(lambda grads: print(sorted(grads)))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.backends.jax_arrays import load_whole_arrays, save_whole_arrays
from baton.backends.jax_distributed import fetch
from baton.backends.maxtext.controlled_step import controlled_train_step
from baton.backends.maxtext.hf_views import LAYER_AXIS, View, leaves, model_views
from baton.backends.maxtext.step_parts import StepParts, optimizer_step
from baton.core.model_state import Hyperparameter, OptimizerGroup, Piece, matches


def _params(state: Any) -> dict[str, Any]:
    from flax import nnx

    return state["model"].filter(nnx.Param).to_pure_dict()


class MaxTextModelState:
    """The ``ModelState`` of a set-up MaxText run (``backend.model_state()``).

    ``state`` returns the run's current train state (each step replaces it; ``assign``
    writes into it in place); ``parts`` are what its steps are built from.
    """

    def __init__(self, state: Callable[[], Any], parts: StepParts) -> None:
        self._state = state
        self._parts = parts
        self._hparams = parts.hparams
        params = _params(state())
        self._views: dict[str, View] = model_views(parts.hparams, params)
        self._shapes = {path: tuple(array.shape) for path, array in leaves(params).items()}
        self._frozen: set[str] = set()
        self._watchers: list[Callable[[Mapping[str, Any]], None]] = []
        self.lr_scale = 1.0
        #: the weight decay set by a callback (``None``: MaxText's configured one)
        self.weight_decay: float | None = None
        #: whether the backend runs the controlled step (a callback asked for it)
        self.active = False
        self._steps: dict[tuple[bool, bool, bool, bool], Callable[..., Any]] = {}
        #: something was frozen or a hyperparameter set: the step applies the controls
        self._adjusts = False
        self._controls: dict[str, Any] | None = None
        self._named: tuple[Any, int, dict[str, Any]] | None = None  # state, version, values
        self._version = 0
        self._to_named: Callable[..., Any] | None = None

    # -- names and values ---------------------------------------------------------------
    def _values(self) -> dict[str, Any]:
        """Every named tensor's value for the current state (one jitted call, cached)."""
        import jax

        state = self._state()
        if self._named is not None and self._named[0] is state and self._named[1] == self._version:
            return self._named[2]
        if self._to_named is None:
            views = self._views
            self._to_named = jax.jit(lambda p: {n: v.value(p) for n, v in views.items()})
        values = self._to_named(_params(state))
        self._named = (state, self._version, values)
        return values

    def parameters(self, patterns: str | Sequence[str] = "*") -> list[Piece]:
        values = self._values()
        pieces = []
        for name, view in self._views.items():
            if matches(name, patterns):
                value = values[name]
                shape = tuple(int(n) for n in value.shape)
                pieces.append(
                    Piece(
                        name=name,
                        value=value,
                        global_shape=shape,
                        index=tuple(slice(0, n) for n in shape),
                        fused=view.fused,
                        frozen=name in self._frozen,
                    )
                )
        return pieces

    def assign(self, values: Mapping[str, Any]) -> None:
        import jax
        from flax import nnx

        unknown = sorted(set(values) - set(self._views))
        if unknown:
            raise KeyError(f"no parameter named {', '.join(unknown)}")
        views = [self._views[name] for name in values]

        @jax.jit
        def put(params: Any, named: Mapping[str, Any]) -> Any:
            for view in views:
                params = view.put(params, named[view.name])
            return params

        state = self._state()
        updated = put(_params(state), dict(values))
        nnx.replace_by_pure_dict(state["model"], updated)
        self._version += 1

    # -- ranks --------------------------------------------------------------------------
    def sum_over_ranks(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return dict(values)  # global arrays: already summed over devices and processes

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        return fetch(values)

    # -- gradients ----------------------------------------------------------------------
    def watch_gradients(self, watcher: Callable[[Mapping[str, Any]], None]) -> None:
        self._watchers.append(watcher)
        self.active = True

    # -- optimizer ----------------------------------------------------------------------
    def _schedule_now(self) -> float:
        import jax

        schedule = self._parts.learning_rate_schedule
        return float(jax.device_get(schedule(optimizer_step(self._state()))))

    def _configured_decay(self) -> float:
        cfg = self._hparams
        if cfg.opt_type in ("adamw", "adam_pax"):
            return float(cfg.adam_weight_decay)
        if cfg.opt_type == "muon":
            return float(cfg.muon_weight_decay)
        return 0.0

    def optimizer_groups(self) -> list[OptimizerGroup]:
        decay = self._configured_decay() if self.weight_decay is None else self.weight_decay
        return [
            OptimizerGroup(
                index=0,
                lr=self._schedule_now() * self.lr_scale,
                weight_decay=decay,
                names=tuple(self._views),
            )
        ]

    def set_hyperparameter(
        self, name: Hyperparameter, value: float, *, groups: Sequence[int] | None = None
    ) -> None:
        self._check_adjustable()
        if groups is not None and set(groups) - {0}:
            raise ValueError(f"MaxText's optimizer has one parameter group (0), not {groups}")
        if name == "lr":
            now = self._schedule_now()
            if now == 0.0:
                raise ValueError(
                    "MaxText's learning-rate schedule is 0 at this step (warmup starts at 0): "
                    "set lr from the next step on, when the schedule has a value to scale"
                )
            self.lr_scale = float(value) / now
        elif name == "weight_decay":
            if self._hparams.opt_type != "adamw":
                raise ValueError(
                    f"weight_decay can be set on MaxText's adamw optimizer only, this run's "
                    f"opt_type is {self._hparams.opt_type}"
                )
            self.weight_decay = float(value)
        else:
            raise ValueError(f"unknown hyperparameter {name!r}: lr or weight_decay")
        self._changed()

    def hyperparameters(self) -> dict[str, Any]:
        """The factor and decay set by callbacks (recorded with each checkpoint)."""
        return {"lr_scale": self.lr_scale, "weight_decay": self.weight_decay}

    def restore_hyperparameters(self, saved: Mapping[str, Any]) -> None:
        """What ``hyperparameters`` returned when a checkpoint was written."""
        self.lr_scale = float(saved.get("lr_scale", 1.0))
        decay = saved.get("weight_decay")
        self.weight_decay = None if decay is None else float(decay)
        if self.lr_scale != 1.0 or self.weight_decay is not None:
            self._changed()

    def lr_metric(self, index: int) -> Callable[[], Any]:
        """The learning rate step ``index`` (0-based) used, computed when fetched."""
        schedule, scale = self._parts.lr_at, self.lr_scale
        if scale == 1.0:
            return lambda: schedule(index)
        return lambda: schedule(index) * scale

    # -- freezing -----------------------------------------------------------------------
    def _matching(self, patterns: str | Sequence[str]) -> list[str]:
        found = [name for name in self._views if matches(name, patterns)]
        if not found:
            raise ValueError(f"no parameter matches {patterns!r}")
        return found

    def freeze(self, patterns: str | Sequence[str]) -> list[str]:
        self._check_adjustable()
        names = self._matching(patterns)
        self._frozen.update(names)
        self._changed()
        return names

    def unfreeze(self, patterns: str | Sequence[str]) -> list[str]:
        self._check_adjustable()
        names = self._matching(patterns)
        self._frozen.difference_update(names)
        self._changed()
        return names

    def _check_adjustable(self) -> None:
        if self._hparams.skip_step_on_spikes:
            raise ValueError(
                "MaxText's skip_step_on_spikes tests the clipped gradient norm, which the "
                "adjusting step (freeze, set_hyperparameter) computes inside the optimizer: "
                "set skip_step_on_spikes=false to freeze or change hyperparameters"
            )

    def _changed(self) -> None:
        self._controls = None
        self.active = self._adjusts = True

    def _trainable(self) -> dict[str, Any]:
        """One boolean array per MaxText array, broadcastable over it (per layer when
        stacked): False where a frozen name's slice lies."""
        import numpy as np

        masks = {}
        for path, shape in self._shapes.items():
            layered = len(shape) > LAYER_AXIS
            extent = [1] * len(shape)
            if layered:
                extent[LAYER_AXIS] = shape[LAYER_AXIS]
            masks[path] = np.ones(extent, dtype=bool)
        for name in self._frozen:
            view = self._views[name]
            if view.layer is None:
                masks[view.path][...] = False
            else:
                masks[view.path][:, view.layer] = False
        return {"/".join(path): mask for path, mask in masks.items()}

    def controls(self) -> dict[str, Any]:
        """The controlled step's data (built again only after a change)."""
        import jax.numpy as jnp

        if self._controls is None:
            delta = 0.0
            if self.weight_decay is not None:
                delta = self.weight_decay - self._configured_decay()
            self._controls = {
                "trainable": {k: jnp.asarray(v) for k, v in self._trainable().items()},
                "lr_scale": jnp.float32(self.lr_scale),
                "decay_delta": jnp.float32(delta),
            }
        return self._controls

    # -- the step -----------------------------------------------------------------------
    def train(self, state: Any, batch: Any, *, donate: bool) -> tuple[Any, Any]:
        """One controlled step of MaxText's ``train_step`` (inside the backend's mesh);
        watchers see the gradients before clipping."""
        watching = bool(self._watchers)
        key = (watching, self._adjusts, self.weight_decay is not None, donate)
        if key not in self._steps:
            gradient_of = {name: view.gradient for name, view in self._views.items()}
            self._steps[key] = controlled_train_step(
                self._parts,
                gradient_of if watching else None,
                adjusts=key[1],
                decays=key[2],
                donate=donate,
            )
        new_state, metrics, grads = self._steps[key](state, batch, self.controls())
        if watching:
            shown = {name: g for name, g in grads.items() if name not in self._frozen}
            for watcher in self._watchers:
                watcher(shown)
        return new_state, metrics

    # -- arrays beside a checkpoint -----------------------------------------------------
    def save_arrays(self, directory: Path, arrays: Mapping[str, Any]) -> None:
        """Process 0 writes every array whole (global arrays): ``arrays-rank0.safetensors``."""
        save_whole_arrays(directory, arrays, {p.name: p for p in self.parameters()})

    def load_arrays(self, directory: Path) -> dict[str, Any]:
        """Every process reads the whole arrays and places each like its parameter."""
        return load_whole_arrays(directory, {p.name: p for p in self.parameters()})
