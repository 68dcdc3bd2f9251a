"""Megatron-Core driven one optimizer step at a time by baton's loop.

``setup`` joins the process group the launch describes (torchrun, SLURM or BATON_*,
through its ``TorchDistributed`` runtime), initialises model-parallel state (tensor, pipeline,
virtual pipeline), builds ``GPTModel`` chunks from the ``TransformerConfig``, wraps each
in Megatron's ``DistributedDataParallel``, builds the optimizer with
``get_megatron_optimizer`` and its ``OptimizerParamScheduler``, and the data through
``megatron.core.datasets`` (prepared datasets with a Hugging Face tokenizer, or bytes).
``train_step`` is Megatron's step: ``get_forward_backward_func()`` (no pipelining, 1F1B
or interleaved) over the micro-batches, ``finalize_model_grads``, ``optimizer.step()``,
scheduler step. Checkpoints are ``dist_checkpointing`` sharded state dicts (model,
optimizer; scheduler, data position, layout and RNG alongside), saved asynchronously on
request (the write on a thread on CPU, ``thread_writer``; Megatron's forked writer with
CUDA; the sharding is validated at a process's first async save only, and Megatron
reuses the cached save plans from its third on, once the second has checked them, as
Megatron-LM's ``--ckpt-assume-constant-structure`` does) and resharded on load to
another tensor/pipeline layout where Megatron can.
``megatron.training`` (Megatron-LM's loop) is never imported.

Example::

    from baton.core import Driver
    from baton.backends.megatron import MegatronBackend, MegatronConfig

    backend = MegatronBackend(MegatronConfig(seq_len=64, global_batch_size=8))
    Driver(backend, max_steps=50, run_dir="runs/megatron-tiny").fit()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from baton.backends.megatron.build import (
    build_model,
    build_optimizer,
    layer_choice,
    transformer_engine_available,
    unfused_attention_line,
)
from baton.backends.megatron.checkpoint import AsyncSaves, load_weights
from baton.backends.megatron.checkpoint_io import MegatronCheckpointIO, TrainingParts
from baton.backends.megatron.checksums import replica_checksums
from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.data import (
    ByteEodTokenizer,
    PreparedSource,
    SampleStream,
    TrainStream,
)
from baton.backends.megatron.evaluation import evaluate_loss, held_out_metrics
from baton.backends.megatron.model_state import MegatronModelState
from baton.backends.megatron.moe_metrics import MoeMetrics
from baton.backends.megatron.objective import (
    LossMetrics,
    check_objective,
    forward_step_of,
    step_results,
    use_objective,
)
from baton.backends.megatron.packed_data import PackedRows
from baton.backends.megatron.plan import flops_per_token, layout_plan
from baton.backends.megatron.rollout_rows import CurrentRollouts, RolloutStream
from baton.backends.megatron.step import gpt_forward_step, run_schedule
from baton.backends.megatron.training_data import build_data, open_data
from baton.backends.torch_distributed import TorchDistributed, UsesTorchDistributed
from baton.backends.weight_checksums import gather
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.cli.overrides import set_fields
from baton.core.errors import UsageError
from baton.core.metrics import StepOutput
from baton.core.objectives import ReferenceUse

log = logging.getLogger("baton")


class MegatronBackend(UsesCheckpointIO[MegatronCheckpointIO], UsesTorchDistributed, BackendBase):
    """Megatron-Core GPTModel, DDP, optimizer and schedules behind baton's loop."""

    name = "megatron"
    distribution = "megatron-core"
    #: built by ``setup``, handed the parts it saves and restores (``checkpoint_io.py``)
    checkpoints: MegatronCheckpointIO

    def __init__(
        self,
        config: MegatronConfig | None = None,
        *,
        rollouts: CurrentRollouts | None = None,
        **overrides: Any,
    ) -> None:
        self.config = config or MegatronConfig()
        set_fields(self.config, overrides)
        #: the process group and device the run trains on
        self.runtime = TorchDistributed()
        #: an objective that trains on rollouts: the step's batch (the rollout phase's
        #: ``current``), read by the data stream at each step (``rollout_rows.py``)
        self.rollouts = rollouts
        #: the DDP-wrapped GPTModel chunks of this rank (several with a virtual pipeline)
        self.chunks: list[Any] = []
        self.optimizer: Any = None
        self.scheduler: Any = None
        #: one stream per chunk (each chunk of an interleaved pipeline reads its own)
        self.train_streams: list[TrainStream] = []
        self.valid_dataset: Any = None
        self.num_microbatches = 1
        #: the prepared datasets and tokenizer (``None``: the byte corpus)
        self.source: PreparedSource | None = None
        #: asynchronous saves' queue, for the process's lifetime (``checkpoint.AsyncSaves``)
        self._async_saves = AsyncSaves()
        self._model_state: MegatronModelState | None = None
        #: a model with experts: its ``moe/*`` metrics (``moe_metrics.py``)
        self._moe: MoeMetrics | None = None
        #: a stored reference's weights, checked before anything is built (``reference.py``)
        self._reference: Path | None = None
        #: the stored reference's fingerprint, recorded in checkpoints
        self.reference_fingerprint: str | None = None
        #: the schedule's forward step: pretraining's, or the objective's on packed rows
        self._forward_step: Callable[..., Any] = gpt_forward_step
        #: the metrics the objective's loss returns (``objective.LossMetrics``)
        self._loss_metrics: LossMetrics | None = None

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """A longer or shorter run (``max_steps``, the schedule's ``decay_steps``) is
        re-applied to the restored schedule."""
        return frozenset({"max_steps"}) if self.config.decay_steps is not None else frozenset()

    def apply_changed_settings(self, changes: Mapping[str, Any]) -> set[str]:
        """After ``load``: the schedule decays to the floor at the decay steps this run
        was built with (the restored step and the warmup kept), not the checkpoint's.

        Example: resumed at step 20 with ``max_steps`` 20 -> 30, the cosine goes on from
        step 20 of a 30-step decay. Returns the names applied."""
        if "max_steps" not in changes or self.config.decay_steps is None:
            return set()
        self.scheduler.extend(self.config.decay_steps)
        if self.scheduler.shape is not None and self.rank == 0:
            log.info(self.scheduler.shape.resume_line(int(self.scheduler.num_steps)))
        return {"max_steps"}

    # -- facts ----------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float:
        """6 x parameters a token uses + attention (the PaLM estimate; ``plan.py``)."""
        return flops_per_token(self.config, self.padded_vocab_size)

    def describe(self) -> dict[str, Any]:
        """The config's shape facts plus the tokenizer (its fingerprint, or ``bytes``)."""
        from baton.data import fingerprint_file, load_tokenizer

        tokenizer = "bytes"
        if self.source is not None:
            tokenizer = self.source.info.fingerprint[:16]
        elif self.config.data.tokenizer is not None:
            path = load_tokenizer(self.config.data.tokenizer).path / "tokenizer.json"
            tokenizer = fingerprint_file(path)[:16]
        facts = {**self.config.describe(), "tokenizer": tokenizer}
        if self.config.packed_rows:  # (absent from pretraining checkpoints)
            facts["objective"] = self.config.objective.name
        if self.reference_fingerprint is not None:
            facts["reference"] = self.reference_fingerprint[:16]
        return facts

    @property
    def tokenizer_vocab_size(self) -> int:
        """Tokens the tokenizer can produce (the prepared data's, else 257 bytes + eod)."""
        return self.source.vocab_size if self.source else ByteEodTokenizer().vocab_size

    @property
    def padded_vocab_size(self) -> int:
        """The model's embedding rows (``config.vocab_size`` or the tokenizer's, padded)."""
        return self.config.padded_vocab_size(self.tokenizer_vocab_size)

    # -- build ------------------------------------------------------------------------
    def check_data(self) -> None:
        """Open and check the configured data and tokenizer before anything is built
        (``DataError`` naming the problem; see ``training_data.open_data``), and a stored
        reference's weights (``reference.checked_reference``)."""
        self.source = open_data(self.config)
        if self.config.objective.reference_use is ReferenceUse.STORED:
            from baton.backends.megatron.reference import checked_reference

            assert self.source is not None, "open_data refuses packed rows without prepared data"
            self._reference = checked_reference(self.config, self.source.info)

    def dry_run(self, world_size: int) -> str:
        """The parallel layout on ``world_size`` ranks, checked by the configuration
        objects alone (the ``dry_run`` ability; no process group, no model)."""
        return layout_plan(self.config, world_size)

    def setup(self) -> None:
        from megatron.core import parallel_state, tensor_parallel

        cfg = self.config
        cfg.check_layout()
        check_objective(cfg)
        layers = layer_choice(cfg)  # refuses Transformer Engine's where it is missing
        self.check_data()
        self.runtime.init_process_group(cfg.dist_backend)
        tp, pp = cfg.parallel_sizes()
        cfg.data_parallel_size(self.world_size)  # validates the layout
        self.num_microbatches = cfg.num_microbatches(self.world_size)
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=cfg.model.virtual_pipeline_model_parallel_size,
            expert_model_parallel_size=cfg.model.expert_model_parallel_size,
            expert_tensor_parallel_size=cfg.model.expert_tensor_parallel_size,
        )
        torch.manual_seed(cfg.seed)
        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
        use_objective(cfg)
        self._loss_metrics = LossMetrics(cfg.objective.objective.metrics)
        self._forward_step = forward_step_of(cfg, self._loss_metrics)
        line = unfused_attention_line(
            layers, te_installed=transformer_engine_available(), gpu=torch.cuda.is_available()
        )
        if line is not None and self.rank == 0:
            log.info(line)
        self.chunks = build_model(
            cfg, vocab_size=self.padded_vocab_size, device=self.runtime.device
        )
        self.optimizer, self.scheduler = build_optimizer(cfg, self.chunks)
        self._moe = MoeMetrics(self.chunks) if cfg.model.num_moe_experts else None
        self.train_streams, self.valid_dataset = build_data(
            cfg,
            self.source,
            chunks=len(self.chunks),
            rank=self.rank,
            world_size=self.world_size,
            barrier=self.barrier,
            rollouts=self.rollouts,
        )
        self.checkpoints = MegatronCheckpointIO(
            TrainingParts(
                self.chunks,
                self.optimizer,
                self.scheduler,
                self.train_streams,
                layout=self.layout(),
                data=cfg.data,
                source=self.source,
            ),
            self._async_saves,
        )
        if self._reference is not None:
            self._score_reference(self._reference)
        if cfg.init_from is not None:
            self.load_weights(Path(cfg.init_from))

    def _score_reference(self, path: Path) -> None:
        """Every sequence's log-probability under the stored reference at ``path``, read
        from beside the data (computed first, with the reference's weights in this model,
        if not stored yet), given to the training rows as their ``reference_logps``
        (``reference.py``)."""
        from baton.backends.megatron.packed_data import REFERENCE_LOGPS
        from baton.backends.megatron.reference import compute_reference_logps
        from baton.backends.reference_logps import stored_or_computed
        from baton.backends.reference_model import reference_fingerprint

        assert self.source is not None, "check_data refuses packed rows without prepared data"
        stream = self.train_streams[0]
        assert isinstance(stream, SampleStream), "a stored reference scores packed rows"
        rows = stream.dataset
        fingerprint = reference_fingerprint(path)

        info = self.source.info

        def reference_of(data: Any) -> Any:  # every row of the dataset ``data`` is cut from
            whole = PackedRows(data.whole, pad_id=rows.pad_id)

            def scored() -> Any:
                self.load_weights(path)
                return compute_reference_logps(self.chunks, whole, self.config, self.runtime.device)

            return stored_or_computed(
                whole.data.prefix,
                fingerprint,
                tokenizer_fingerprint=info.fingerprint,
                engine=self.name,
                compute=scored,
                num_sequences=whole.data.num_sequences,
            )

        values = rows.document_values[REFERENCE_LOGPS] = reference_of(rows.data)
        held = self.valid_dataset
        if held is not None:  # held-out rows: the same reference, or their data's own
            same = held.data.whole.prefix == rows.data.whole.prefix
            held.document_values[REFERENCE_LOGPS] = values if same else reference_of(held.data)
        self.reference_fingerprint = fingerprint

    def load_weights(self, directory: Path) -> None:
        """Load only the model's weights (a checkpoint under any layout it can reshard,
        or a Hugging Face directory); optimizer, schedule and data position stay fresh."""
        load_weights(self.chunks, self.optimizer, Path(directory))

    def model(self) -> Any:
        """The first (usually the only) DDP-wrapped model chunk."""
        return self.chunks[0] if self.chunks else None

    @property
    def train_stream(self) -> TrainStream | None:
        return self.train_streams[0] if self.train_streams else None

    # -- the rollout phase's collectives ----------------------------------------------
    def gather_weights(self) -> dict[str, torch.Tensor] | None:
        """The model's current weights as whole tensors by their Hugging Face names (the
        names and shapes ``baton export`` writes) on global rank 0, ``None`` elsewhere;
        gathered over tensor-parallel ranks, pipeline stages and expert-parallel ranks
        (``gathered_weights.py``). A collective: every rank calls it. A model not built
        from a Hugging Face spec has no such names: ``UsageError``."""
        from baton.backends.megatron.gathered_weights import gather_hf_weights

        assert self.chunks, "setup() must run before gather_weights()"
        if self.config.spec is None:
            raise UsageError(
                "the model has no Hugging Face architecture to gather its weights by: build "
                "it from --model-config CONFIG or --init-from HF_DIR"
            )
        return gather_hf_weights(self.chunks, self.config.spec)

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        assert self.train_streams, "setup() must run before train_step()"
        cfg = self.config
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = self.optimizer.param_groups[0]["lr"]
        if self._moe is not None:
            self._moe.begin_step()
        for stream in self.train_streams:
            if isinstance(stream, RolloutStream):  # this step's rollouts
                stream.begin_step()
        reduced = run_schedule(
            self.chunks,
            self.train_streams,
            cfg,
            num_microbatches=self.num_microbatches,
            forward_only=False,
            forward_step=self._forward_step,
        )  # Megatron's schedule ends in finalize_model_grads (``use_objective``)
        if self._model_state is not None:  # gradients before clipping, to the watchers
            self._model_state.before_clipping()
        self._async_saves.wait_for_staging()  # a save still copies what the step changes
        update_successful, grad_norm, _ = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=1)
        metrics: dict[str, Any] = {"lr": lr, "skipped_update": 0.0 if update_successful else 1.0}
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        if self._moe is not None:
            metrics.update(self._moe_metrics())
        loss, objective_metrics = step_results(
            cfg, reduced, self.runtime.device, self._loss_metrics
        )
        metrics.update(objective_metrics)
        return StepOutput(
            loss=loss,
            metrics=metrics,
            tokens=cfg.global_batch_size * cfg.seq_len,
            samples=cfg.global_batch_size,
            data_wait_s=sum(stream.take_wait() for stream in self.train_streams),
        )

    def _moe_metrics(self) -> dict[str, torch.Tensor]:
        assert self._moe is not None
        return self._moe.step_metrics(
            self.num_microbatches,
            data_parallel=self.config.data_parallel_size(self.world_size),
            tensor_parallel=self.config.model.tensor_model_parallel_size,
        )

    def evaluate(self) -> Mapping[str, Any]:
        """Mean loss over the first ``eval_micro_batches`` x micro-batches of the valid
        split (``evaluation.py``); on packed rows, the objective's loss over every held-out
        row (``evaluation.held_out_metrics``)."""
        device = self.runtime.device
        if self.config.packed_rows:
            return held_out_metrics(self.chunks, self.valid_dataset, self.config, device)
        return evaluate_loss(self.chunks, self.valid_dataset, self.config, device)

    # -- the model to callbacks -------------------------------------------------------
    def model_state(self) -> MegatronModelState:
        """Parameters by name, gradients, optimizer groups and freezing (ability
        ``model_state``; see ``megatron/model_state.py``)."""
        assert self.chunks, "setup() must run before model_state()"
        if self._model_state is None:
            self._model_state = MegatronModelState(
                self.chunks, self.optimizer, self.scheduler, spec=self.config.spec, fetch=self.fetch
            )
        return self._model_state

    # -- silent-corruption checks ------------------------------------------------------
    def gather_weight_checksums(self) -> list[dict[str, str]]:
        """Every rank's checksums of its parameters and replicated optimizer state
        (ability ``weight_checksums``; see ``megatron/checksums.py``)."""
        return [entry or {} for entry in gather(replica_checksums(self.chunks, self.optimizer))]

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Everything but step replay; evaluation refused where there are no rows to
        evaluate on (rollouts, sampled each step; packed rows or prepared pretraining
        data that hold none out), weight checksums where no rank holds a data-parallel
        replica."""
        cfg = self.config
        no_replica = bool(self.chunks) and cfg.data_parallel_size(self.world_size) == 1
        return Abilities(
            evaluate=True,
            async_save=True,
            multi_rank=True,
            weight_checksums=True,
            model_state=True,
            dry_run=True,
        ).refusing(
            evaluate=evaluation_refusal(cfg),
            weight_checksums=(
                "data-parallel size 1: every rank holds its own shard, no replica to "
                "compare; launch more ranks than tensor x pipeline parallel"
                if no_replica
                else None
            ),
        )

    # -- checkpoints: MegatronCheckpointIO (checkpoint_io.py), through UsesCheckpointIO --
    def layout(self) -> dict[str, Any]:
        """This run's parallel layout, recorded in every checkpoint."""
        cfg = self.config
        tp, pp = cfg.parallel_sizes()
        return {
            "tensor": tp,
            "pipeline": pp,
            "virtual_pipeline": cfg.model.virtual_pipeline_model_parallel_size or 1,
            "expert": cfg.model.expert_model_parallel_size,
            "data": cfg.data_parallel_size(self.world_size),
            "distributed_optimizer": bool(cfg.ddp.use_distributed_optimizer),
            "padded_vocab_size": self.padded_vocab_size,
        }

    # -- end --------------------------------------------------------------------------
    def teardown(self) -> None:
        """Finish saves in flight, destroy model-parallel state and the process group
        baton created, so another run in this process starts clean."""
        from megatron.core import parallel_state

        self._async_saves.close()
        if self._moe is not None:
            self._moe.close()
            self._moe = None
        parallel_state.destroy_model_parallel()
        self.chunks, self.train_streams, self._model_state = [], [], None
        self.optimizer = self.scheduler = self.valid_dataset = None
        vars(self).pop("checkpoints", None)  # built by the next setup, on its own parts
        self.runtime.teardown_process_group()


def evaluation_refusal(config: MegatronConfig) -> str | None:
    """Why ``config``'s run cannot evaluate (it has no rows to evaluate on), or ``None``."""
    objective = config.objective.name
    if config.holds_rows_out:
        return None
    if config.rollouts:
        return (
            f"--objective {objective} trains on each step's rollouts: no validation split; "
            "run with --eval-every 0"
        )
    if config.packed_rows:
        return (
            f"--objective {objective} holds no packed row out: no validation split; hold "
            "some out with --eval-split F or give --eval-data-path PREFIX, or run with "
            "--eval-every 0"
        )
    return (
        "the prepared pretraining data holds no document out: no validation split; hold "
        "some out with --eval-split F, or run with --eval-every 0"
    )
