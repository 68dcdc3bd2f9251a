"""MaxText (JAX) through baton's loop: MaxText's own setup and jitted ``train_step``.

``setup`` runs what MaxText's ``train.py`` runs before its loop: ``train.initialize``
(config from ``key=value`` overrides), ``train_utils.setup_train_loop`` (mesh, model,
optimizer, sharded state), ``sharding.maybe_update_params_sharding_with_opt`` and
``train_utils.jit_train_and_eval_step``. Each baton step then calls the jitted
``train.train_step`` once on the next batch, which MaxText's ``DataLoader`` places on
the mesh. Batches come from baton's byte-level text stream (``data.TextBatches``), or,
when the config names a tokenizer, from MaxText's own Grain (prepared ``mmap`` data) or
Hugging Face (local JSON/Parquet) pipeline (``input_pipeline``); for post-training from
prepared rows (``packed_batches``) or, for an objective that samples its rows (GRPO),
from the rollout phase (``rollout_batches``; its collectives ``gather_weights`` and
``broadcast`` are the backend's).

Metrics stay on the device; ``fetch`` brings everything a log step needs to the host
with one ``jax.device_get`` (``JaxDistributed``, shared with the other JAX backends).

Checkpoints are written by MaxText's own checkpointer (``checkpointing.save_checkpoint``
on an orbax ``Checkpointer``) into the directory baton gives: ``<dir>/checkpoint/`` is a
MaxText checkpoint directory holding one step ``<name>/`` with ``items`` (the state) and,
for the Grain pipeline, ``iter`` (the data iterator's state, as MaxText saves it), so
MaxText itself can resume from it; ``<dir>/data.json`` holds the position of baton's
data streams. The layout (mesh, scan_layers, processes), samples consumed and the data's
fingerprint are ``checkpoint_facts``, core's record in ``baton.json`` (the checkpoint
I/O, ``checkpoint_io.py``, is handed the state, the data and the steps in ``setup``).
Restores go through ``checkpointing.load_state_if_possible`` onto this run's shardings:
orbax reshards a checkpoint saved on another mesh; a layout it cannot map (a different
``scan_layers``, a different number of Grain data processes) is refused naming both.
Saves are asynchronous when the driver asks: on CPU in one process the whole
``save_checkpoint`` call runs on a writer thread and the next step keeps the saved
arrays (``background_save``); otherwise orbax's own asynchronous save (``PendingSave``
over the checkpointer).

Step numbers: after baton step ``n`` the optimizer has taken ``n`` updates
(``state.optimizer.step == n``), while MaxText names the checkpoint written after that
update by its 0-based loop index, ``n - 1``. ``maxtext_checkpoint_name(n)`` and
``baton_step_of_maxtext_checkpoint(name)`` convert; ``restore_maxtext_checkpoint``
loads a checkpoint written by MaxText's own loop.

Example::

    from baton.core import Driver
    from baton.backends.maxtext import MaxTextBackend, TINY_CPU

    backend = MaxTextBackend(overrides=TINY_CPU | {"steps": 200, "run_name": "tiny"})
    Driver(backend, max_steps=200, run_dir="runs/maxtext_tiny").fit()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.async_save import BackgroundSaves
from baton.backends.jax_distributed import JaxDistributed
from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus, eval_batches
from baton.backends.maxtext.checkpoint import dataset_type
from baton.backends.maxtext.checkpoint_io import MaxTextCheckpointIO, TrainingData
from baton.backends.maxtext.config import SHAPE_KEYS, MaxTextConfig
from baton.backends.maxtext.input_pipeline import native_data_fingerprint
from baton.backends.maxtext.model_state import MaxTextModelState
from baton.backends.maxtext.packed_batches import PackedBatches
from baton.backends.maxtext.plan import planned_on_host
from baton.backends.maxtext.rollout_batches import (
    RolloutBatches,
    RolloutSource,
    prompts_fingerprint,
)
from baton.backends.maxtext.step_parts import StepParts, optimizer_step
from baton.backends.maxtext.train_steps import TrainSteps
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.cli.overrides import set_fields
from baton.core.errors import UsageError
from baton.core.metrics import StepOutput

#: MaxText's metric names that mean something else under baton's names: ``grad_norm`` is
#: the norm before clipping on every backend (MaxText's ``raw_grad_norm``); MaxText's own
#: ``grad_norm`` is measured after clipping
_METRIC_NAMES: dict[str, str] = {
    "learning/raw_grad_norm": "grad_norm",
    "learning/grad_norm": "grad_norm_clipped",
    "learning/moe_lb_loss": "moe/aux_loss",  # as MaxText adds it to the loss
}


#: MaxText's settings that ``_check_layout`` reads
LAYOUT_KEYS = ("num_query_heads", "ici_tensor_parallelism", "num_experts", "ici_expert_parallelism")


def _check_layout(settings: Mapping[str, Any]) -> None:
    """Query heads by the tensor-parallel degree, experts by the expert-parallel degree,
    from MaxText's settings (the overrides before MaxText parses them, then its parsed
    config), before the model is built (``UsageError``)."""
    from baton.core.model.parallel_layout import check_divides

    def number(key: str) -> int | None:
        value = settings.get(key)
        return None if value is None else int(value)

    heads = number("base_num_query_heads") or number("num_query_heads")
    check_divides("--tp", number("ici_tensor_parallelism") or 1, heads, "attention heads")
    if (number("num_experts") or 1) > 1:
        check_divides(
            "--ep", number("ici_expert_parallelism") or 1, number("num_experts"), "experts"
        )


def _check_supported(cfg: Any) -> None:
    """Refuse MaxText settings that only MaxText's own loop can run."""
    if cfg.enable_diloco:
        raise ValueError("enable_diloco is not supported by the baton MaxText backend yet")
    if cfg.moe_dropless_fallback == "step":
        raise ValueError(
            "moe_dropless_fallback=step replays steps inside MaxText's own loop; "
            "use moe_dropless_fallback=none or layer with baton"
        )


class MaxTextBackend(UsesCheckpointIO[MaxTextCheckpointIO], JaxDistributed, BackendBase):
    """MaxText's jitted JAX train step (any MaxText model and mesh), one call per baton step."""

    name = "maxtext"
    distribution = "maxtext"

    def __init__(
        self,
        config: MaxTextConfig | None = None,
        *,
        overrides: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        self.config = config or MaxTextConfig()
        if overrides:
            self.config.update(overrides)
        set_fields(self.config, fields, hint="; MaxText settings go in overrides={...}")
        #: MaxText's resolved config (``pyconfig.HyperParameters``) after ``setup``
        self.hparams: Any = None
        self.mesh: Any = None
        self.state: Any = None  # nnx.State of MaxText's TrainStateNNX
        self._graphdef: Any = None
        self.batches: TextBatches | PackedBatches | RolloutBatches | None = None
        #: on a run that trains on rollouts: the rollout phase (the recipe sets it), whose
        #: current batch the data stream reads each step
        self.rollouts: RolloutSource | None = None
        #: MaxText's own data iterator (Grain or Hugging Face pipeline), else None
        self.data_iterator: Any = None
        #: the training data as checkpoints save it, with the batches read (after setup)
        self.data: TrainingData | None = None
        self.learning_rate_schedule: Callable[[int], Any] | None = None
        #: which train step runs, and the model-state view (after setup)
        self.steps: TrainSteps | None = None
        #: the writer thread of background saves (the checkpoint I/O submits to it)
        self._saves = BackgroundSaves()
        self._p_eval: Any = None
        self._loader: Any = None
        self._rampup: Any = None
        self._eval: list[dict[str, np.ndarray]] = []
        #: a post-training run's held-out rows (``posttrain.HeldOutRows``), and the parts
        #: they are evaluated with
        self._held: Any = None
        self._parts: StepParts | None = None
        #: a short hash of the training data (core refuses a resume on other data)
        self.data_fingerprint = ""

    # -- facts ----------------------------------------------------------------------
    @property
    def graphdef(self) -> Any:
        """The model's and optimizer's structure (``nnx.split``) after ``setup``."""
        return self._graphdef

    @property
    def device_type(self) -> str:
        if self.mesh is None:
            return str(self.config.get("hardware", "cpu")).replace("_multiprocess", "")
        return str(self.mesh.devices.flat[0].platform)

    @property
    def flops_per_token(self) -> float | None:
        if self.hparams is None:
            return None
        from maxtext.utils import maxtext_utils

        total_tflops, _, _ = maxtext_utils.calculate_tflops_training_per_device(
            self.hparams, log=False
        )
        tokens_per_device = self.hparams.per_device_batch_size * self.hparams.max_target_length
        return float(total_tflops) * 1e12 / tokens_per_device

    def describe(self) -> dict[str, Any]:
        keys = ("model_name", *SHAPE_KEYS, "max_target_length")
        if self.hparams is None:
            return {"model": {k: self.config.get(k) for k in keys if k in self.config}}
        return {"model": {k: getattr(self.hparams, k) for k in keys}}

    # -- build ------------------------------------------------------------------------
    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Evaluation, asynchronous saves, several processes, the model-state view and a
        dry run; no skipping data, checksums or step replay."""
        return Abilities(
            evaluate=True, async_save=True, multi_rank=True, model_state=True, dry_run=True
        )

    def dry_run(self, world_size: int) -> str:
        """The mesh, parameter count and FLOPs on ``world_size`` simulated host devices,
        without allocating the model (the ``dry_run`` ability); call it before JAX starts."""
        return planned_on_host(self.config, world_size)

    def _setup_train_loop(self, cfg: Any, recorder: Any) -> tuple[Any, ...]:
        """MaxText's ``setup_train_loop``, with baton's schedule shape when the config
        has ``warmup_steps`` (``lr_schedule.py``)."""
        from maxtext.utils import train_utils

        from baton.backends.maxtext.lr_schedule import baton_schedule

        if self.config.warmup_steps is None:
            return train_utils.setup_train_loop(cfg, recorder)
        with baton_schedule(self.config.warmup_steps, self.config.lr_schedule):
            return train_utils.setup_train_loop(cfg, recorder)

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """A longer or shorter run (``max_steps``: MaxText's ``steps``) is re-applied to
        the restored optimizer: its schedule is rebuilt from this run's config."""
        return frozenset({"max_steps"})

    def apply_changed_settings(self, changes: Mapping[str, Any]) -> set[str]:
        """After ``load``: the optimizer's restored ``count`` runs on the schedule this
        run built for ``steps`` (the warmup kept, the decay ending at the new total);
        says what follows. Returns the names applied."""
        from baton.backends.maxtext.lr_schedule import shape_of

        if "max_steps" not in changes or changes["max_steps"][1] != int(self.hparams.steps):
            return set()  # the recipe did not build this run's schedule for the new total
        hparams = self.hparams
        if self.config.warmup_steps is not None and self.rank == 0:
            shape = shape_of(hparams, self.config.warmup_steps, self.config.lr_schedule)
            logging.getLogger("baton").info(shape.resume_line(self.optimizer_step()))
        return {"max_steps"}

    def setup(self) -> None:
        _check_layout(self.config.overrides)  # before JAX or MaxText is imported
        import jax
        from flax import nnx
        from maxtext.common.data_loader import create_dataloader
        from maxtext.trainers.pre_train import train
        from maxtext.utils import sharding, train_utils

        self.initialize_distributed()  # jax.distributed for a multi-process launch
        cfg, recorder = train.initialize(self.config.argv())
        self.hparams = cfg
        _check_layout({k: getattr(cfg, k, None) for k in LAYOUT_KEYS})
        _check_supported(cfg)
        (
            _init_rng,
            _checkpoint_manager,
            state_shardings,
            _model,
            self.mesh,
            self.learning_rate_schedule,
            maxtext_iterator,
            maxtext_loader,
            self._rampup,
            maxtext_eval_iterator,
            train_state,
        ) = self._setup_train_loop(cfg, recorder)
        self._graphdef, state = nnx.split(train_state)
        params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
            cfg, state_shardings
        )
        if cfg.shard_optimizer_over_data:
            state = jax.device_put(state, state_shardings)
        self.state = state
        parts = StepParts(
            cfg,
            self.graphdef,
            self.mesh,
            state_shardings,
            params_shardings,
            self.learning_rate_schedule,
            lr_at=jax.jit(self.learning_rate_schedule),  # one dispatch per log step
        )

        self._setup_data(parts, maxtext_iterator, maxtext_eval_iterator)
        p_train, self._p_eval = train_utils.jit_train_and_eval_step(
            cfg,
            self.graphdef,
            self.mesh,
            state,
            state_shardings,
            train.train_step,
            train.eval_step,
            self._eval or None,
            params_shardings,
        )
        if self.batches is not None:
            self._loader = create_dataloader(cfg, self.mesh, self.batches, recorder, self._rampup)
        else:
            self._loader = maxtext_loader
        self.steps = TrainSteps(parts, p_train, lambda: self.state)
        self.data = TrainingData(
            self.dataset_type, self.batches, self.data_iterator, self.data_fingerprint
        )
        self.checkpoints = MaxTextCheckpointIO(
            state=lambda: self.state,
            hparams=cfg,
            layout=self.layout(),
            device_type=self.device_type,
            data=self.data,
            steps=self.steps,
            saves=self._saves,
        )

    def _setup_data(
        self, parts: StepParts, maxtext_iterator: Any, maxtext_eval_iterator: Any
    ) -> None:
        """Prepared post-training rows, baton's byte stream, or MaxText's own pipeline as
        its train.py builds it."""
        cfg = self.hparams
        if self.config.objective.objective.rollouts:  # the rollout phase's rows, each step
            self.batches = self._rollout_batches(cfg)
            self.data_fingerprint = prompts_fingerprint(str(self.config.data_path))
        elif self.config.post_training:  # prepared rows (and a stored reference), fed by baton
            from baton.backends.maxtext.posttrain import post_training_stream

            self.batches, self.data_fingerprint, self._held = post_training_stream(
                self.config, parts, self.state
            )
            self._parts = parts
        elif self.config.byte_stream:
            corpus = TextCorpus.load(self.config.data_path)
            self.data_fingerprint = corpus.fingerprint()
            self.batches = TextBatches(
                corpus.train,
                batch_size=int(cfg.global_batch_size_to_load),
                seq_len=int(cfg.max_target_length),
                seed=self.config.data_seed,
            )
            self._eval = eval_batches(
                corpus.val,
                batch_size=int(cfg.global_batch_size_to_load_eval),
                seq_len=int(cfg.max_target_length),
                num_batches=self.config.eval_batches,
            )
        else:  # MaxText's own pipeline, as its train.py builds it
            self.data_iterator = maxtext_iterator
            self.data_fingerprint = native_data_fingerprint(cfg)
            if maxtext_eval_iterator is not None:  # a fixed set, the same at every evaluation
                self._eval = [next(maxtext_eval_iterator) for _ in range(self.config.eval_batches)]

    def _rollout_batches(self, cfg: Any) -> RolloutBatches:
        """The stream of the rollout phase's batches (``rollouts``, set by the recipe),
        one whole global batch a step: MaxText must train on every row it loads."""
        if self.rollouts is None:
            raise RuntimeError(
                f"--objective {self.config.objective.name} trains on rollouts: give the "
                "backend the rollout phase (backend.rollouts = phase)"
            )
        rows = int(cfg.global_batch_size_to_train_on)
        if int(cfg.global_batch_size_to_load) != rows:
            raise UsageError(
                f"MaxText would load {cfg.global_batch_size_to_load} rows a step and train on "
                f"{rows}: every rollout must be trained on; make --batch-size a multiple of --tp"
            )
        return RolloutBatches(
            self.rollouts,
            rows=rows,
            length=int(cfg.max_target_length),
            document_values=self.config.objective.objective.document_values,
        )

    # -- the rollout phase's collectives ------------------------------------------------
    def gather_weights(self) -> dict[str, np.ndarray] | None:
        """The model's current weights as whole tensors by their Hugging Face names (the
        names and shapes ``baton export`` writes) on process 0, ``None`` on the others;
        every process calls it (``rollout_collectives``)."""
        from baton.backends.maxtext.rollout_collectives import gathered_hf_weights

        if self.state is None:
            raise RuntimeError("gather_weights() is available after setup")
        if self.config.model_spec is None:
            raise UsageError(
                "the model has no Hugging Face architecture to name its weights by: build it "
                "with --model-config CONFIG or --init-from HF_DIR"
            )
        return gathered_hf_weights(self.state, self.config.model_spec)

    def broadcast(self, obj: Any) -> Any:
        """Process 0's ``obj`` on every process (a collective; ``rollout_collectives``)."""
        from baton.backends.maxtext.rollout_collectives import broadcast_from_first

        return broadcast_from_first(obj)

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        import jax
        from flax.core.spmd import logical_axis_rules

        cfg = self.hparams
        started = time.perf_counter()
        batch = self._loader.load_next_batch(rampup_manager=self._rampup)
        waited = time.perf_counter() - started
        assert self.data is not None and self.steps is not None
        self.data.batches_read += 1
        with jax.set_mesh(self.mesh), logical_axis_rules(cfg.logical_axis_rules):
            self.state, metrics = self.steps.run(self.state, batch)
        scalars = metrics["scalar"]
        values: dict[str, Any] = {}
        skipped = {"learning/loss"} | ({"learning/moe_lb_loss"} if cfg.num_experts <= 1 else set())
        if not self.config.objective.objective.native_cross_entropy:  # token-loss views
            skipped |= {"learning/lm_loss", "learning/perplexity", "learning/z_loss"}
        for key, value in scalars.items():
            if key not in skipped:
                values[_METRIC_NAMES.get(str(key), str(key).removeprefix("learning/"))] = value
        values["lr"] = self.steps.lr_metric(
            step - 1
        )  # MaxText's 0-based step; computed when fetched
        samples = int(cfg.global_batch_size_to_train_on)
        return StepOutput(
            loss=scalars["learning/loss"],
            metrics=values,
            tokens=samples * int(cfg.max_target_length),
            samples=samples,
            data_wait_s=waited,
        )

    def evaluate(self) -> Mapping[str, Any]:
        """Token-weighted loss over the fixed validation batches (lazy device values); a
        post-training run's held-out rows: the objective's loss over every one of them
        (``posttrain.HeldOutRows``)."""
        import jax
        from flax.core.spmd import logical_axis_rules
        from maxtext.utils import sharding

        if self._held is not None and self._parts is not None:
            return self._held.evaluate(self._parts, self.state)
        if not self._eval or self._p_eval is None:
            why = (
                "the validation split is shorter than one eval batch"
                if self.config.has_eval_data
                else "hold packed rows out with --eval-split F or --eval-data-path PREFIX, or "
                "do not ask for evaluation"
                if self.config.post_training
                else "MaxText's own pipelines evaluate on separate files: pass eval_data_path "
                "(--eval-data-path), or do not ask for evaluation"
            )
            raise RuntimeError(f"no validation batches: {why}")
        cfg = self.hparams
        data_sharding = sharding.get_input_data_sharding(
            cfg, self.mesh, rules=cfg.logical_axis_rules_for_eval
        )
        total, weights = 0.0, 0.0
        for batch in self._eval:
            placed = jax.device_put(batch, data_sharding)
            with jax.set_mesh(self.mesh), logical_axis_rules(cfg.logical_axis_rules_for_eval):
                scalars = self._p_eval(self.state, placed)["scalar"]
            total = total + scalars["evaluation/total_loss"]
            weights = weights + scalars["evaluation/total_weights"]
        return {"loss": total / weights}

    # -- checkpoints ----------------------------------------------------------------
    def optimizer_step(self) -> int:
        """The optimizer's update count (a host sync; used at save and load only)."""
        return optimizer_step(self.state)

    @property
    def dataset_type(self) -> str:
        """MaxText's ``dataset_type`` as text: synthetic (baton's bytes), grain or hf."""
        return dataset_type(self.hparams)

    def layout(self) -> dict[str, Any]:
        """How the state is laid out: the mesh, the stacking of layers, the processes."""
        import jax

        return {
            "mesh": {k: int(v) for k, v in self.mesh.shape.items() if v > 1},
            "devices": int(jax.device_count()),
            "processes": int(jax.process_count()),
            "scan_layers": bool(self.hparams.scan_layers),
        }

    # -- callbacks on the model (the ``model_state`` ability) --------------------------
    def model_state(self) -> MaxTextModelState:
        """Parameters by name, gradients, learning rate and freezing (``model_state.py``)."""
        if self.state is None or self.steps is None:
            raise RuntimeError("model_state() is available after setup")
        return self.steps.model_state()

    # -- checkpoints: MaxTextCheckpointIO (checkpoint_io.py, built in setup), through
    #    UsesCheckpointIO -----------------------------------------------------------
    def restore_maxtext_checkpoint(self, step_dir: str | Path) -> int:
        """Load a checkpoint MaxText's own loop wrote (``<checkpoint_dir>/<name>``); the
        baton step to continue from (``MaxTextCheckpointIO.restore_maxtext_checkpoint``)."""
        return self.checkpoints.restore_maxtext_checkpoint(step_dir)

    def teardown(self) -> None:
        """Drop the device state and compiled steps (patches restore process settings)."""
        self._saves.close()  # the driver waited for the saves; the thread stops
        self.state = self.steps = None
        self._p_eval = self._loader = self._held = self._parts = None
        if self.data_iterator is not None and hasattr(self.data_iterator, "close"):
            self.data_iterator.close()  # stops Grain's worker processes
        self.data_iterator = None
