"""TorchTitan driven one optimizer step at a time by baton's loop.

The backend builds TorchTitan's ``Trainer`` from its native ``Trainer.Config``
(``backend.config``, editable in ``on_configure``) and calls the real
``trainer.train_step`` once per baton step, so users get TorchTitan's parallelisms
(FSDP, TP, PP, CP), kernels and compile. The duties of TorchTitan's own loop
(``Trainer.train``) move here: periodic GC, the profiler, process-group timeouts
after the first step, checkpointing with TorchTitan's DCP ``CheckpointManager`` and
validation with its validator.

Example::

    from baton.core import Driver
    from baton.backends.torchtitan import TorchTitanBackend
    from baton.backends.torchtitan.configs import llama3_debug

    backend = TorchTitanBackend(llama3_debug(steps=20))
    Driver(backend, max_steps=20, run_dir="runs/titan").fit()

Metrics: ``loss`` (global average over valid tokens, as TorchTitan logs it),
``grad_norm`` and ``lr`` (or ``lr/<optimizer>[/<group>]`` with several) come back
as lazy values (``capture.StepCapture``), and for a mixture-of-experts model
``moe/load_balance`` (``moe_metrics.ExpertLoad``, reduced on log steps only);
TorchTitan's own metric logging keeps its ``metrics.log_freq`` cadence and its host
sync on those steps only.

Checkpoints: baton decides when and where; ``setup`` enables TorchTitan's
``CheckpointManager`` with ``interval=1`` and ``keep_latest_k=0`` (baton keeps the
history) and points it at baton's directory for each save. ``checkpoint.async_mode``
(``"async"``, ``"async_with_pinned_mem"``) makes saves asynchronous; the second stages
the copy on a thread while the next step runs forward and backward (on a CPU-only
machine without pinned memory, see ``checkpoint_io.stage_without_accelerator``). A checkpoint
saved on another layout loads through DCP's resharding (see ``plan_load``); the
layout, samples consumed and the rest of ``checkpoint_facts`` go into ``baton.json``.

Online RL (an objective that samples rollouts each step, GRPO): the recipe hands the
backend the rollout phase's current batch (``read_rollouts``) and the phase the
backend's two collectives: ``gather_weights`` (the policy's weights whole, by Hugging
Face name, on the first rank: ``gathered_weights.py``) and ``broadcast`` (the first
rank's object on every rank). ``Trainer.train_step`` reads this rank's share of each
step's rollouts through ``rollout_rows.RolloutDataLoader``.

Weights-only start (fine-tuning): ``config.checkpoint.initial_load_path`` names a baton
checkpoint (``runs/x/checkpoints/step_000100``) or a TorchTitan ``step-N`` folder;
TorchTitan's initial load path reads the model weights only
(``initial_load_model_only``) and training starts at step 0 with a fresh optimizer.
``export.export_hf`` writes a checkpoint as a Hugging Face model directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from baton.backends import torch_distributed
from baton.backends.torch_distributed import TorchDistributed, UsesTorchDistributed
from baton.backends.torch_logps import metric_means
from baton.backends.torch_model_state import TorchModelState
from baton.backends.torchtitan.batches import CountedBatches
from baton.backends.torchtitan.capture import StepCapture
from baton.backends.torchtitan.checkpoint_io import (
    RESHARD_DATA,
    TitanCheckpointIO,
    stage_without_accelerator,
)
from baton.backends.torchtitan.checksums import replica_checksums, replica_refusal
from baton.backends.torchtitan.evaluation import NO_VALIDATION, validate
from baton.backends.torchtitan.held_out import HeldOut, holds_rows_out
from baton.backends.torchtitan.hf import vocab_mismatch
from baton.backends.torchtitan.moe_metrics import ExpertLoad
from baton.backends.torchtitan.plan import check_model_layout, parallelism_plan
from baton.backends.torchtitan.reduction import (
    MetricMean,
    RankLocal,
    full_tensor,
    global_values,
    model_parameters,
)
from baton.backends.weight_checksums import gather
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoint_record import LOAD_ALL, LoadPlan
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.metrics import StepOutput
from baton.core.patches import PatchRecorder

if TYPE_CHECKING:
    from baton.backends.torchtitan.row_feed import RowFeed
    from baton.data.rollouts import RolloutBatch

logger = logging.getLogger(__name__)


def launch_env(launch: Launch) -> dict[str, str]:
    """The launcher variables TorchTitan reads (``LOCAL_RANK`` picks its device) for a
    process torchrun did not start: SLURM's or ``BATON_*`` settings, or one process."""
    if launch.distributed:
        return launch.torch_env()
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}


def resolve_paths(cfg: Any) -> None:
    """Make the paths a user gave relative to where they ran absolute before TorchTitan
    sees them (it refuses a relative ``initial_load_path``): the weights to start from (a
    Hugging Face directory, a baton checkpoint or TorchTitan's step-N folder) and the
    tokenizer directory (``hf_assets_path``)."""
    checkpoint = cfg.checkpoint
    if checkpoint.initial_load_path and checkpoint.initial_load_in_hf:
        checkpoint.initial_load_path = str(Path(checkpoint.initial_load_path).resolve())
    elif checkpoint.initial_load_path:
        from baton.backends.torchtitan.export import dcp_folder

        checkpoint.initial_load_path = str(dcp_folder(checkpoint.initial_load_path).resolve())
    if cfg.hf_assets_path:
        cfg.hf_assets_path = str(Path(cfg.hf_assets_path).resolve())


class TorchTitanBackend(UsesCheckpointIO[TitanCheckpointIO], UsesTorchDistributed, BackendBase):
    """TorchTitan's Trainer, its real train_step once per baton step."""

    name = "torchtitan"
    distribution = "torchtitan"

    def __init__(self, config: Any, *, reshard_data: str = "refuse") -> None:
        if reshard_data not in RESHARD_DATA:
            raise ValueError(f"reshard_data={reshard_data!r}: use one of {RESHARD_DATA}")
        if config is None or not hasattr(config, "model_spec"):
            raise TypeError(
                "TorchTitanBackend needs a torchtitan Trainer.Config, e.g. "
                "baton.backends.torchtitan.configs.llama3_debug() or "
                "torchtitan.models.llama3.config_registry.llama3_8b()"
            )
        self.config = config
        self.reshard_data = reshard_data
        #: the process group and device (the Trainer's) the run trains on
        self.runtime = TorchDistributed()
        self.trainer: Any = None
        self._capture: StepCapture | None = None
        self._experts: ExpertLoad | None = None
        self._parameters: int | None = None
        self._model_state: TorchModelState | None = None
        self._batches: CountedBatches | None = None
        self._rows: RowFeed | None = None
        self._rollouts: Callable[[], RolloutBatch | None] | None = None
        self._held: HeldOut | None = None
        self._profiler: Any = None
        self._steps_run = 0
        self._changes = PatchRecorder()  # process-wide changes for TorchTitan, undone on teardown

    # -- facts ------------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float | None:
        if self.trainer is None:
            return None
        return float(self.trainer.metrics_processor.num_flops_per_token)

    @property
    def batch_degree(self) -> int:
        """How many data-parallel ranks read distinct batches."""
        dims = self.trainer.parallel_dims
        return dims.get_mesh("batch").size() if dims.dp_enabled else 1

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        facts: dict[str, Any] = {
            "model": f"{cfg.model_spec.name}/{cfg.model_spec.flavor}",
            "seq_len": cfg.training.seq_len,
            "local_batch_size": cfg.training.local_batch_size,
            "global_batch_size": cfg.training.global_batch_size,
        }
        if self._parameters is not None:
            facts["parameters"] = self._parameters
        return facts

    # -- build ------------------------------------------------------------------------
    def dry_run(self, world_size: int) -> str:
        """The parallelism plan on ``world_size`` ranks: TorchTitan's own degree checks,
        the model on the meta device (the ``dry_run`` ability; no GPU, no memory)."""
        return parallelism_plan(self.config, world_size)

    def setup(self) -> None:
        from torchtitan.components.checkpointer import CheckpointManager

        cfg = self.config
        check_model_layout(cfg)
        if not isinstance(cfg.checkpoint, CheckpointManager.Config):
            raise TypeError(
                "baton saves with TorchTitan's DCP CheckpointManager; config.checkpoint is "
                f"{type(cfg.checkpoint).__qualname__}: use CheckpointManager.Config()"
            )
        cfg.checkpoint.enable = True
        cfg.checkpoint.interval = 1
        cfg.checkpoint.keep_latest_k = 0
        init_from = cfg.checkpoint.initial_load_path  # as given: a reference's source
        resolve_paths(cfg)
        mismatch = vocab_mismatch(cfg)
        if mismatch is not None:  # an IndexError at step 1 otherwise
            raise UsageError(
                f"the model's vocabulary sizes disagree ({mismatch}); change the vocabulary "
                "with --model-config (a config.json) or a --tokenizer, not one field by --set"
            )
        from baton.backends.torchtitan.moe import expert_parallel_refusal

        refusal = expert_parallel_refusal(cfg)
        if refusal is not None:
            raise UsageError(refusal)
        self._join_launch()
        self.trainer = cfg.build()
        trainer = self.trainer
        self.runtime.device = trainer.device
        self.checkpoints = TitanCheckpointIO(trainer, reshard_data=self.reshard_data)
        vocab = trainer.tokenizer.get_vocab_size()
        model_vocab = getattr(trainer.model_config, "vocab_size", None)
        if model_vocab is not None and vocab > model_vocab:
            raise ValueError(
                f"the tokenizer has {vocab} ids but the model's vocabulary has {model_vocab}; "
                "pass --model-config with a larger vocab_size or a smaller tokenizer"
            )
        self._capture = StepCapture(trainer)
        self._experts = ExpertLoad.attach(trainer.model_parts)
        #: every stage's parameters together (recorded in checkpoints, compared on resume)
        self._parameters = model_parameters(trainer)
        if cfg.checkpoint.async_mode == "async_with_pinned_mem":
            stage_without_accelerator(trainer.checkpointer)
        if cfg.checkpoint.initial_load_path:  # weights-only start (initial_load_model_only)
            trainer.checkpointer.load(step=cfg.checkpoint.load_step)
        from baton.backends.torchtitan.objective_loss import ObjectiveLoss

        if isinstance(trainer.loss_fn, ObjectiveLoss):  # stored values, before any step
            from baton.backends.torchtitan.row_feed import row_feed

            self._rows = row_feed(trainer, cfg, trainer.loss_fn.run, init_from=init_from)
            trainer.loss_fn.feed = self._rows
            self._held = HeldOut.of(  # held-out rows (and their stored values), if any
                trainer, cfg, trainer.loss_fn.run, stored=self._rows.stored,
                init_from=init_from,
            )  # fmt: skip

        from baton.backends.torchtitan.rollout_rows import RolloutDataLoader

        if isinstance(trainer.dataloader, RolloutDataLoader):
            if self._rollouts is None:
                raise ValueError(
                    "config.dataloader reads rollouts: give the backend the rollout phase's "
                    "current batch with read_rollouts(lambda: phase.current) before setup"
                )
            trainer.dataloader.current = self._rollouts

    def _join_launch(self) -> None:
        """Rank and world from the launch (torchrun, SLURM, ``BATON_*`` or one process);
        baton creates the process group, so TorchTitan's ``init_distributed`` finds it made
        and changes no NCCL or flight-recorder variables. Like TorchTitan's, it turns
        autograd multithreading off (its DeviceMesh stack is thread-local)."""
        launch = Launch.from_env()
        if launch.source != "torchrun":
            for key, value in launch_env(launch).items():
                self._changes.setenv(key, value)
        cfg = self.config
        backend = "auto"
        if torch.cuda.is_available() and cfg.training.enable_cpu_offload:
            backend = "cuda:nccl,cpu:gloo"
        multithreading = torch._C._is_multithreading_enabled()
        torch.autograd.set_multithreading_enabled(False)
        self._changes.on_undo(
            "autograd multithreading",
            lambda: torch.autograd.set_multithreading_enabled(multithreading),
        )
        self.runtime.init_process_group(
            backend, timeout=timedelta(seconds=cfg.comm.init_timeout_seconds)
        )

    # -- online RL: the rollout phase's batches and collectives -------------------------
    def read_rollouts(self, current: Callable[[], RolloutBatch | None]) -> None:
        """Train on rollouts: ``current()`` is the batch the rollout phase made for the
        step about to run (``phase.current``); each step reads this rank's share of it
        (``config.dataloader`` must be ``rollout_rows.RolloutDataLoader.Config``)."""
        self._rollouts = current

    def gather_weights(self) -> dict[str, torch.Tensor] | None:
        """The model's current weights as whole tensors by Hugging Face name (the names
        and shapes ``baton export`` writes) on global rank 0, ``None`` on the other ranks;
        a collective: every rank calls it (``gathered_weights.py``)."""
        from baton.backends.torchtitan.gathered_weights import gather_hf_weights

        assert self.trainer is not None, "call setup() first"
        return gather_hf_weights(self.trainer, keep=self.rank == 0)

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        trainer, capture = self.trainer, self._capture
        assert trainer is not None and capture is not None, "call setup() first"
        if self._batches is None:  # after any resume, like TorchTitan's train()
            self._batches = CountedBatches(
                trainer, take=self._rows.take if self._rows is not None else None
            )
            self._profiler = self.config.profiler.build(
                global_step=step - 1, base_folder=self.config.dump_folder
            )
            self._profiler.__enter__()
        trainer.step = step
        trainer.gc_handler.run(step)
        lrs = trainer.lr_schedulers.get_metrics()
        self._batches.start_step()
        if self._rows is not None:
            self._rows.start_step()
        if self._experts is not None:
            self._experts.start_step()
        with capture.step():
            trainer.train_step(self._batches)
        self._profiler.step()
        self._steps_run += 1
        if self._steps_run == 1 and self.world_size > 1:
            from torchtitan.distributed import utils as dist_utils

            dist_utils.set_pg_timeouts(
                timeout=timedelta(seconds=self.config.comm.train_timeout_seconds),
                parallel_dims=trainer.parallel_dims,
            )
        metrics: dict[str, Any] = {}
        if capture.grad_norm is not None:
            metrics["grad_norm"] = capture.grad_norm
        if len(lrs) == 1:
            metrics["lr"] = next(iter(lrs.values()))
        else:
            metrics.update(lrs)
        if self._rows is not None:  # the objective's metrics, means over the global batch
            metrics.update(self._objective_metrics(self._rows))
        counts = self._experts.step_counts() if self._experts is not None else None
        if counts is not None:
            metrics["moe/load_balance"] = counts
        loss = capture.loss
        if loss is not None:
            loss = self._rank_local({"loss": loss})["loss"]
        degree = self.batch_degree
        return StepOutput(
            loss=loss,
            metrics=metrics,
            tokens=self._batches.tokens * degree,
            samples=self._batches.samples * degree,
            data_wait_s=self._batches.wait_s,
        )

    def _rank_local(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` whose global value is their sum over the loss mesh (and the last
        pipeline stage's), reduced on log steps only (``fetch``)."""
        dims = self.trainer.parallel_dims
        if dims.dp_cp_enabled or dims.pp_enabled:
            return {key: RankLocal(value) for key, value in values.items()}
        return dict(values)

    def _objective_metrics(self, rows: RowFeed) -> dict[str, Any]:
        """The objective's metrics of the step: ``sum / weight`` of this rank's sums, or
        where data-parallel ranks share the batch, means of the sums over the loss mesh
        (one reduction on log steps, ``fetch``)."""
        sums, names = rows.metric_sums(), rows.metric_names
        if sums is None or names is None:
            return {}
        dims = self.trainer.parallel_dims
        if dims.dp_cp_enabled:
            return {name: MetricMean(sums, i) for i, name in enumerate(names)}
        return metric_means(sums, names)

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Reduce rank-local values over the loss mesh, then one host transfer."""
        return torch_distributed.fetch(global_values(values, self.trainer), prepare=full_tensor)

    def evaluate(self) -> Mapping[str, Any]:
        """Run TorchTitan's validator (``config.validator``) and return its loss
        (``evaluation.py``); a post-training run's held-out rows: the objective's loss
        over all of them (``held_out.py``)."""
        if self._held is not None:
            return self._held.evaluate(self.trainer, self.config.training.local_batch_size)
        return validate(self.trainer, self.config)

    # -- the model, its gradients and optimizer (model_state) --------------------------
    def model_state(self) -> TorchModelState:
        """Parameters under Hugging Face names, gradients before clipping, optimizer
        groups and freezing (``torchtitan/model_state.py``); built on first use."""
        if self.trainer is None or self._capture is None:
            raise RuntimeError("model_state() is available after setup()")
        if self._model_state is None:
            from baton.backends.torchtitan.model_state import titan_model_state

            self._model_state = titan_model_state(self.trainer, self.fetch)
            self._capture.before_clip = self._model_state.before_clipping
        return self._model_state

    # -- silent-corruption checks ------------------------------------------------------
    def gather_weight_checksums(self) -> list[dict[str, str]]:
        """Every rank's checksums of its parameters' and optimizer state's local parts
        (ability ``weight_checksums``; see ``torchtitan/checksums.py``)."""
        return [entry or {} for entry in gather(replica_checksums(self.trainer, self.rank))]

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Everything but skipping data and step replay; evaluation where TorchTitan's
        validator is on (``--eval-split``, ``--eval-data-path``), an asynchronous save where
        ``checkpoint.async_mode`` is set, weight checksums where a ``dp_replicate``
        dimension holds replicas to compare."""
        asynchronous = getattr(self.config.checkpoint, "async_mode", "disabled") != "disabled"
        no_replica = None if self.trainer is None else replica_refusal(self.trainer.parallel_dims)
        evaluates = bool(self.config.validator.enable) or holds_rows_out(self.config)
        return Abilities(
            evaluate=evaluates,
            async_save=asynchronous,
            multi_rank=True,
            weight_checksums=True,
            model_state=True,
            dry_run=True,
        ).refusing(
            weight_checksums=no_replica,
            evaluate=None if evaluates else NO_VALIDATION,
        )

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """A longer or shorter run (``max_steps``: ``training.steps``) is re-applied to
        the restored schedule, which keeps only its step."""
        return frozenset({"max_steps"})

    def apply_changed_settings(self, changes: Mapping[str, Any]) -> set[str]:
        """After ``load``: TorchTitan's scheduler kept only the restored step and its
        factor is this run's (built for ``training.steps``), so the warmup stays and the
        decay ends at the new total; says so. Returns the names applied."""
        from baton.backends.torchtitan.lr_schedule import BatonScheduleConfig, shape_of

        trainer = self.trainer
        assert trainer is not None, "apply_changed_settings is called after setup"
        if "max_steps" not in changes:
            return set()
        total = int(self.config.training.steps)
        if changes["max_steps"][1] != total:
            return set()  # the recipe did not build this run's schedule for the new total
        schedule_config = self.config.lr_scheduler
        if isinstance(schedule_config, BatonScheduleConfig) and self.rank == 0:
            scheduler = trainer.lr_schedulers.schedulers[0]
            shape = shape_of(schedule_config, total, peak=float(scheduler.base_lrs[0]))
            logger.info(shape.resume_line(int(scheduler.last_epoch)))
        return {"max_steps"}

    # -- checkpoints: TitanCheckpointIO (checkpoint_io.py), through UsesCheckpointIO -----
    def layout(self) -> dict[str, int]:
        """This run's parallel layout as TorchTitan resolved it, and its world size."""
        return self.checkpoints.layout()

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore model, optimizer, scheduler, data loader and step from ``save``'s
        output (through DCP's resharding onto this layout, ``plan_load``)."""
        super().load(directory, plan)
        self._batches = None  # a fresh iterator over the restored loader state

    # -- end --------------------------------------------------------------------------
    def teardown(self) -> None:
        trainer = self.trainer
        try:
            if self._profiler is not None:
                self._profiler.__exit__(None, None, None)
            if trainer is not None:
                if trainer.checkpointer is not None:
                    trainer.checkpointer.maybe_wait_for_saving()
                trainer.close()
        finally:
            if self._capture is not None:
                self._capture.remove()
            if self._experts is not None:
                self._experts.remove()
            self._experts = None
            self._capture = None
            self._model_state = None
            self._profiler = None
            self._batches = None
            self._rows = self._held = None
            if "checkpoints" in vars(self):  # it holds the Trainer
                del self.checkpoints
            self.trainer = None
            self.runtime.device = torch.device("cpu")
            self.runtime.teardown_process_group()
            self._changes.undo()
