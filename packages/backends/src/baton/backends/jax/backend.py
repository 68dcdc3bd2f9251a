"""Bring your own JAX model: a flax model, an optax optimizer, a loss function and an
iterable of batches, trained by baton's loop with one jitted step per baton step.

What baton does with them:

- ``setup``: ``jax.distributed`` from the launch (several processes), the model taken
  apart into parameters and other state (``nnx.split``; see ``model.py``), the optimizer
  state (``optimizer.init``), one jitted step with the state donated
  (``donate_argnums``), and with several devices a ``Mesh`` over a ``data`` axis:
  parameters and optimizer state replicated, each batch split along its leading axis.
- ``train_step``: the next batch, ``jax.value_and_grad`` of ``loss_fn(model, batch)``,
  ``optimizer.update``, ``optax.apply_updates``. The loss and the loss function's
  metrics stay on the device; a log step fetches them with one ``jax.device_get``.
- ``save``/``load``: orbax (synchronous or asynchronous) for the train state, and the
  data position of each process (``data.py``) in a small JSON file; the facts core
  records in ``baton.json`` (``checkpoint_facts``: processes, samples consumed).

Example::

    from baton.backends.jax import JaxBackend
    from baton.core import Driver

    def loss_fn(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    backend = JaxBackend(
        model=lambda: MyModel(rngs=nnx.Rngs(0)),
        optimizer=optax.adamw(1e-3),
        loss_fn=loss_fn,
        train_data=lambda: my_batches(seed=0),      # dicts of numpy arrays
    )
    Driver(backend, max_steps=100, run_dir="runs/mine").fit()

The loss function returns a scalar loss, or ``(loss, metrics)`` with a dict of scalars
(logged under their names). Tokens and samples per step are counted from each batch
(leading axis = samples; tokens = samples x the second axis of the first integer array
with two or more axes); pass ``count_batch(batch) -> (tokens, samples)`` where that is
not right. No torch is imported on this path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from baton.backends.jax.checkpoint_io import JaxCheckpointIO
from baton.backends.jax.data import BatchStream, DataEnd
from baton.backends.jax.model_state import JaxModelState, StepControls
from baton.backends.jax.progress import TrainProgress
from baton.backends.jax.steps import LossFunctionError, loss_and_metrics, make_train_step
from baton.backends.jax_distributed import JaxDistributed
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.cli.overrides import set_fields
from baton.core.metrics import StepOutput


class BatchRejected(ValueError):
    """The model (or the loss function) could not run on a batch."""


@dataclass
class JaxConfig:
    """The JAX backend's settings: the user's pieces and how to drive them."""

    #: an ``nnx.Module``, a zero-argument factory returning one, or a ``flax.linen.Module``
    model: Any = None
    #: an ``optax.GradientTransformation``
    optimizer: Any = None
    #: ``loss_fn(model, batch) -> loss`` or ``-> (loss, {"name": scalar, ...})``
    loss_fn: Callable[[Any, Any], Any] | None = None
    #: an iterable of batches (dicts of numpy arrays), or a factory returning one
    train_data: Any = None
    #: batches to evaluate on (re-iterated by every evaluation), or a factory
    eval_data: Any = None
    #: at most this many evaluation batches per evaluation (``None``: all)
    eval_batches: int | None = None
    #: ``eval_fn(model, batch)`` like ``loss_fn``; default ``loss_fn`` with the model in
    #: evaluation mode (``nnx.Module.eval()``)
    eval_fn: Callable[[Any, Any], Any] | None = None
    #: a ``flax.linen`` model's variables (``module.init(...)``)
    variables: Any = None
    #: the learning-rate schedule given to the optimizer, logged as ``lr``
    lr_schedule: Callable[[Any], Any] | None = None
    #: ``count_batch(batch) -> (tokens, samples)`` of one process's batch
    count_batch: Callable[[Any], tuple[int, int]] | None = None
    #: at the end of the training data: ``restart`` another epoch, or ``stop`` (raise)
    on_data_end: DataEnd = "restart"
    #: name of the mesh axis batches are split along
    data_axis: str = "data"
    #: FLOPs per trained token for MFU (default ``6 x parameters``)
    flops_per_token: float | None = None
    #: facts recorded in each checkpoint; a resume with different ones fails clearly
    facts: dict[str, Any] = field(default_factory=dict)


def default_count(batch: Any) -> tuple[int, int]:
    """``(tokens, samples)`` of a batch: the leading axis counts samples; the first
    integer array with two or more axes gives tokens per sample (else one)."""
    import jax

    arrays = [x for x in jax.tree.leaves(batch) if np.ndim(x) >= 1]
    if not arrays:
        raise BatchRejected(
            "the batch has no array with a batch axis; batches are dicts of numpy arrays "
            "whose leading axis is the batch"
        )
    samples = int(np.shape(arrays[0])[0])
    for x in arrays:
        if np.ndim(x) >= 2 and np.issubdtype(np.asarray(x).dtype, np.integer):
            return samples * int(np.shape(x)[1]), samples
    return samples, samples


def describe_batch(batch: Any) -> str:
    """``{'x': int32[8, 64], ...}``: the shapes and dtypes of a batch, for error messages."""
    import jax

    def one(x: Any) -> str:
        arr = np.asarray(x) if not hasattr(x, "dtype") else x
        return f"{arr.dtype}{list(np.shape(arr))}"

    return str(jax.tree.map(one, batch))


class JaxBackend(UsesCheckpointIO[JaxCheckpointIO], JaxDistributed, BackendBase):
    """The user's flax model and optax optimizer, one jitted step per baton step."""

    name = "jax"
    distribution = "jax"

    def __init__(self, config: JaxConfig | None = None, **fields: Any) -> None:
        self.config = config or JaxConfig()
        set_fields(self.config, fields)
        self.state: dict[str, Any] | None = None
        self.mesh: Any = None
        self.data: BatchStream | None = None
        self.kind = ""
        self.num_params = 0
        #: the host's counts of optimizer steps and samples drawn (the data position)
        self.progress = TrainProgress()
        self._step: Any = None
        self._eval: Any = None
        self._replicated: Any = None
        self._batch_sharding: Any = None
        self._split: Any = None
        self._variants: dict[tuple[bool, bool, bool], Any] = {}
        self._model_state: JaxModelState | None = None
        #: what callbacks on the model asked of the step (``model_state.py``)
        self.controls = StepControls()

    # -- facts ----------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float | None:
        if self.config.flops_per_token is not None:
            return float(self.config.flops_per_token)
        return 6.0 * self.num_params if self.num_params else None

    def describe(self) -> dict[str, Any]:
        facts = dict(self.config.facts)
        if self.kind:
            facts |= {"kind": self.kind, "parameters": self.num_params}
        return {"jax_model": facts}

    # -- build ------------------------------------------------------------------------
    def _check_config(self) -> None:
        cfg = self.config
        required = ("model", "optimizer", "loss_fn", "train_data")
        missing = [k for k in required if getattr(cfg, k) is None]
        if missing:
            raise ValueError(
                f"the JAX backend needs {', '.join(missing)}: "
                "JaxBackend(model=..., optimizer=optax..., loss_fn=..., train_data=...)"
            )
        if not (hasattr(cfg.optimizer, "init") and hasattr(cfg.optimizer, "update")):
            raise TypeError(
                f"optimizer must be an optax.GradientTransformation (init/update), got "
                f"{type(cfg.optimizer).__name__}"
            )
        if not callable(cfg.loss_fn):
            raise TypeError("loss_fn must be a function loss_fn(model, batch) -> loss")

    def setup(self) -> None:
        self.initialize_distributed()
        import jax
        import jax.numpy as jnp
        from jax.sharding import AxisType, NamedSharding
        from jax.sharding import PartitionSpec as P

        from baton.backends.jax.model import split_model

        self._check_config()
        cfg = self.config
        split = split_model(cfg.model, cfg.variables)
        self.kind = split.kind
        self.num_params = int(sum(np.size(x) for x in jax.tree.leaves(split.params)))
        state = {
            "params": split.params,
            "rest": split.rest,
            "opt_state": cfg.optimizer.init(split.params),
            "step": jnp.zeros((), jnp.int32),
        }
        if jax.process_count() > 1:
            _check_same_params(split.params)
        if jax.device_count() > 1:
            # Auto axes: XLA propagates the shardings, the user's code needs no annotations
            self.mesh = jax.make_mesh(
                (jax.device_count(),), (cfg.data_axis,), axis_types=(AxisType.Auto,)
            )
            self._replicated = NamedSharding(self.mesh, P())
            self._batch_sharding = NamedSharding(self.mesh, P(cfg.data_axis))
            state = jax.tree.map(self._replicate, state)
        self.state = state
        self._step, self._eval = self._compile(split)
        self.data = BatchStream(cfg.train_data, on_data_end=cfg.on_data_end)
        self.checkpoints = JaxCheckpointIO(
            read_state=lambda: self.state,
            write_state=self._put_state,
            data=self.data,
            progress=self.progress,
            controls=self.controls,
            rank=jax.process_index(),
            processes=jax.process_count(),
        )

    def _put_state(self, state: dict[str, Any]) -> None:
        self.state = state

    def _replicate(self, value: Any) -> Any:
        import jax

        if _is_key(value):  # PRNG keys travel as their raw data
            data = self._replicate(jax.random.key_data(value))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(value))
        return jax.make_array_from_process_local_data(self._replicated, np.asarray(value))

    def _compile(self, split: Any) -> tuple[Any, Any]:
        """The jitted train step (state donated) and evaluation step."""
        import jax

        cfg = self.config
        merge, loss_fn = split.merge, cfg.loss_fn
        eval_fn = cfg.eval_fn or loss_fn

        def eval_step(state: dict[str, Any], batch: Any) -> Any:
            model = merge(state["params"], state["rest"])
            if cfg.eval_fn is None and hasattr(model, "eval") and split.kind == "nnx":
                model.eval()
            return loss_and_metrics(eval_fn(model, batch))

        self._split = split
        train = self._jit_train(make_train_step(split, cfg.optimizer, self._loss_of))
        if self.mesh is None:
            return train, jax.jit(eval_step)
        return train, jax.jit(eval_step, out_shardings=self._replicated)

    def _loss_of(self, model: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        assert self.config.loss_fn is not None
        return loss_and_metrics(self.config.loss_fn(model, batch))

    def _jit_train(self, step: Any, *, variant: bool = False) -> Any:
        """``step`` jitted with the state donated (over the mesh: the state replicated;
        a variant's gradients too)."""
        import jax

        if self.mesh is None:
            return jax.jit(step, donate_argnums=0)
        state_sharding = jax.tree.map(lambda _: self._replicated, self.state)
        outputs = (state_sharding, self._replicated) + ((self._replicated,) if variant else ())
        return jax.jit(step, donate_argnums=0, out_shardings=outputs)

    def _variant_step(self, key: tuple[bool, bool, bool]) -> Any:
        """The step variant a callback on the model asked for (compiled once per kind:
        gradients returned, a freezing mask, an lr scale; see ``steps.py``)."""
        if key not in self._variants:
            grads, masked, scaled = key
            step = make_train_step(
                self._split, self.config.optimizer, self._loss_of,
                grads=grads, masked=masked, scaled=scaled,
            )  # fmt: skip
            self._variants[key] = self._jit_train(step, variant=True)
        return self._variants[key]

    # -- callbacks on the model (the ``model_state`` ability) --------------------------
    def model_state(self) -> JaxModelState:
        """The parameters by name, gradients, lr and freezing (``model_state.py``)."""
        if self._model_state is None:
            self._model_state = JaxModelState(
                lambda: self.state, self.controls, self.config.lr_schedule, self.progress
            )
        return self._model_state

    # -- the step ---------------------------------------------------------------------
    def _place(self, batch: Any) -> Any:
        """The host batch on the devices: split along the data axis over the mesh."""
        import jax

        if self.mesh is None:
            return batch
        local = jax.local_device_count()
        for x in jax.tree.leaves(batch):
            if np.ndim(x) == 0 or np.shape(x)[0] % local:
                raise BatchRejected(
                    f"batch {describe_batch(batch)} cannot be split over {local} devices of "
                    f"this process: every array's leading (batch) axis must be a multiple of "
                    f"{local}"
                )
        return jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(self._batch_sharding, np.asarray(x)),
            batch,
        )

    def _count(self, batch: Any) -> tuple[int, int]:
        count = self.config.count_batch or default_count
        tokens, samples = count(batch)
        processes = self.world_size
        return int(tokens) * processes, int(samples) * processes

    def train_step(self, step: int) -> StepOutput:
        assert self.data is not None and self.state is not None
        started = time.perf_counter()
        batch = self.data.next()
        waited = time.perf_counter() - started
        tokens, samples = self._count(batch)
        try:
            variant = self.controls.variant
            if variant is None:  # nothing asked of the step: the plain one
                self.state, (loss, aux) = self._step(self.state, self._place(batch))
            else:
                arguments = self.controls.arguments(self.state["params"])
                step_fn = self._variant_step(variant)
                self.state, (loss, aux), grads = step_fn(self.state, self._place(batch), arguments)
                if self.controls.watchers:
                    self.controls.show(grads)
        except (LossFunctionError, BatchRejected):
            raise
        except (TypeError, ValueError) as error:
            raise BatchRejected(
                f"the model rejected training batch {describe_batch(batch)} at step {step}: {error}"
            ) from error
        self.progress.steps_done += 1
        self.progress.samples_consumed += samples
        metrics: dict[str, Any] = dict(aux)
        schedule = self.config.lr_schedule
        if schedule is not None:
            index = (
                self.progress.steps_done - 1
            )  # the update just made used schedule(count before it)
            scale = self.controls.lr_scale
            metrics["lr"] = lambda: schedule(index) * scale
        return StepOutput(
            loss=loss, metrics=metrics, tokens=tokens, samples=samples, data_wait_s=waited
        )

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Evaluation, skipping data, asynchronous saves, several processes and the
        model-state view."""
        return Abilities(
            evaluate=True, skip_data=True, async_save=True, multi_rank=True, model_state=True
        )

    def evaluate(self) -> Mapping[str, Any]:
        """Mean loss (and mean metrics) over the evaluation batches, as device values."""
        cfg = self.config
        if cfg.eval_data is None:
            raise RuntimeError(
                "no evaluation data: pass eval_data=... (an iterable of batches or a factory)"
            )
        source: Any = cfg.eval_data
        if callable(source) and not isinstance(source, Iterable):
            source = source()
        totals: dict[str, Any] = {}
        count = 0
        for batch in source:
            if cfg.eval_batches is not None and count >= cfg.eval_batches:
                break
            try:
                loss, aux = self._eval(self.state, self._place(batch))
            except (LossFunctionError, BatchRejected):
                raise
            except (TypeError, ValueError) as error:
                raise BatchRejected(
                    f"the model rejected evaluation batch {describe_batch(batch)}: {error}"
                ) from error
            for key, value in {"loss": loss, **aux}.items():
                totals[key] = totals[key] + value if key in totals else value
            count += 1
        if count == 0:
            raise RuntimeError("the evaluation data yields no batches")
        return {key: value / count for key, value in totals.items()}

    def skip_data(self, steps: int) -> None:
        """Draw and discard ``steps`` batches (one batch per optimizer step); the data
        position core records (``samples_consumed``) moves past them too."""
        assert self.data is not None
        for _ in range(steps):
            self.progress.samples_consumed += self._count(self.data.next())[1]

    # -- checkpoints: JaxCheckpointIO (checkpoint_io.py, built in setup), through
    #    UsesCheckpointIO -----------------------------------------------------------
    def teardown(self) -> None:
        """Drop the device state and the compiled steps."""
        self.state = None
        self._step = self._eval = None
        self._variants.clear()


def _check_same_params(params: Any) -> None:
    """Every process must start from the same parameters (they are replicated)."""
    import jax
    from jax.experimental import multihost_utils

    checksum = np.array([sum(float(np.sum(np.asarray(x))) for x in jax.tree.leaves(params))])
    every = np.asarray(multihost_utils.process_allgather(checksum.astype(np.float32)))
    if not np.all(every == every.reshape(-1)[0]):
        raise ValueError(
            f"the processes built different initial parameters (checksums {every.ravel()}); "
            "build the model with the same seed on every process"
        )


def _is_key(value: Any) -> bool:
    import jax

    return hasattr(value, "dtype") and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)
