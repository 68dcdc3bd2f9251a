"""Megatron-Core driven one optimizer step at a time by baton's loop.

``setup`` joins the process group the launch describes (torchrun, SLURM or BATON_*,
through ``TorchDistributed``), initialises model-parallel state (tensor, pipeline,
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
import torch.distributed as dist

from baton.backends.megatron.build import build_model, build_optimizer
from baton.backends.megatron.checkpoint import load_weights
from baton.backends.megatron.checkpoint_io import MegatronCheckpointIO
from baton.backends.megatron.checksums import replica_checksums
from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.data import (
    ByteEodTokenizer,
    PreparedSource,
    SampleStream,
    build_gpt_datasets,
    build_indexed_dataset,
    check_split_not_empty,
    open_prepared,
)
from baton.backends.megatron.model_state import MegatronModelState
from baton.backends.megatron.moe_metrics import MoeMetrics
from baton.backends.megatron.plan import layout_plan, moe_layer_count
from baton.backends.megatron.step import gpt_forward_step
from baton.backends.torch_distributed import TorchDistributed
from baton.backends.weight_checksums import gather
from baton.core.backend import BackendBase
from baton.core.checkpoint_io import UsesCheckpointIO
from baton.core.metrics import StepOutput

log = logging.getLogger("baton")


class MegatronBackend(UsesCheckpointIO[MegatronCheckpointIO], TorchDistributed, BackendBase):
    """Megatron-Core GPTModel, DDP, optimizer and schedules behind baton's loop."""

    name = "megatron"
    distribution = "megatron-core"
    supports_async_save = True

    def __init__(self, config: MegatronConfig | None = None, **overrides: Any) -> None:
        self.config = config or MegatronConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"MegatronConfig has no field {key!r}")
            setattr(self.config, key, value)
        #: the DDP-wrapped GPTModel chunks of this rank (several with a virtual pipeline)
        self.chunks: list[Any] = []
        self.optimizer: Any = None
        self.scheduler: Any = None
        #: one stream per chunk (each chunk of an interleaved pipeline reads its own)
        self.train_streams: list[SampleStream] = []
        self.valid_dataset: Any = None
        self.num_microbatches = 1
        #: the prepared datasets and tokenizer (``None``: the byte corpus)
        self.source: PreparedSource | None = None
        self.checkpoints = MegatronCheckpointIO(self)
        self._model_state: MegatronModelState | None = None
        #: a model with experts: its ``moe/*`` metrics (``moe_metrics.py``)
        self._moe: MoeMetrics | None = None

    # -- facts ----------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float:
        """6 x parameters a token uses + attention (the PaLM estimate), over the whole
        model (a MoE layer: its router and the token's top-k experts)."""
        m = self.config.model
        h, layers, seq = m.hidden_size, m.num_layers, self.config.seq_len
        ffn = m.ffn_hidden_size or 4 * h
        kv = (m.num_query_groups or m.num_attention_heads) / m.num_attention_heads
        matrices = 3 if m.gated_linear_unit else 2
        attention = 2 * h * h + 2 * h * h * kv
        mlp = matrices * h * ffn
        # a MoE layer: its router and the token's top-k experts
        routed = (m.num_moe_experts or 0) * h + m.moe_router_topk * matrices * h * (
            m.moe_ffn_hidden_size or ffn
        )
        sparse = moe_layer_count(m)
        used = layers * attention + (layers - sparse) * mlp + sparse * routed
        vocab = self.padded_vocab_size
        return 6.0 * (used + vocab * h) + 12.0 * layers * h * seq

    def describe(self) -> dict[str, Any]:
        """The config's shape facts plus the tokenizer (its fingerprint, or ``bytes``)."""
        from baton.data import fingerprint_file, load_tokenizer

        tokenizer = "bytes"
        if self.source is not None:
            tokenizer = self.source.info.fingerprint[:16]
        elif self.config.data.tokenizer is not None:
            path = load_tokenizer(self.config.data.tokenizer).path / "tokenizer.json"
            tokenizer = fingerprint_file(path)[:16]
        return {**self.config.describe(), "tokenizer": tokenizer}

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
        """Open and check the configured data and tokenizer before anything is built:
        ``DataError`` for a missing tokenizer or ``.idx``, a tokenizer other than the
        data's, one with more tokens than the model's vocabulary, or a split share that
        gets no document."""
        from baton.data import DataError, check_model_vocab

        data = self.config.data
        if data.data_path is None:
            if data.tokenizer is not None:
                raise DataError(
                    f"tokenizer {data.tokenizer} given without a data path: prepare the text "
                    "with `baton data prepare ... --tokenizer DIR --output PREFIX` and pass "
                    "the prefix (or a blend) as the data path"
                )
            self.source = None
            return
        if data.tokenizer is None:
            raise DataError(
                f"data path {data.data_path!r} needs the tokenizer it was prepared with: "
                "pass its Hugging Face tokenizer directory"
            )
        self.source = open_prepared(data.data_path, data.tokenizer)
        if self.config.vocab_size is not None:
            check_model_vocab(self.source.info, self.config.vocab_size)
        check_split_not_empty(self.source, data.split or "98,2,0")

    def dry_run(self, world_size: int) -> str:
        """The parallel layout on ``world_size`` ranks, checked by the configuration
        objects alone (the ``dry_run`` ability; no process group, no model)."""
        return layout_plan(self.config, world_size)

    def setup(self) -> None:
        from megatron.core import parallel_state, tensor_parallel

        cfg = self.config
        self.check_data()
        self.init_process_group(cfg.dist_backend)
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
        self.chunks = build_model(cfg, vocab_size=self.padded_vocab_size, device=self._device)
        self.optimizer, self.scheduler = build_optimizer(cfg, self.chunks)
        self._moe = MoeMetrics(self.chunks) if cfg.model.num_moe_experts else None
        self._build_data()
        if cfg.init_from is not None:
            self.load_weights(Path(cfg.init_from))

    def load_weights(self, directory: Path) -> None:
        """Load only the model's weights (a checkpoint under any layout it can reshard,
        or a Hugging Face directory); optimizer, schedule and data position stay fresh."""
        load_weights(self.chunks, self.optimizer, Path(directory))

    def model(self) -> Any:
        """The first (usually the only) DDP-wrapped model chunk."""
        return self.chunks[0] if self.chunks else None

    @property
    def train_stream(self) -> SampleStream | None:
        return self.train_streams[0] if self.train_streams else None

    def _build_data(self) -> None:
        from megatron.core import parallel_state

        cfg = self.config
        if self.source is not None:
            datasets = self._prepared_datasets(self.source)
        elif cfg.data.kind == "mock":
            datasets = build_gpt_datasets(None, seq_len=cfg.seq_len, seed=cfg.seed, mock=True)
        else:
            prefix = str(Path(cfg.data.cache_dir) / "text")
            if self.rank == 0:
                build_indexed_dataset(prefix, cfg.data.text_path)
            self.barrier()
            prefix = build_indexed_dataset(prefix, cfg.data.text_path)  # verifies the hash
            datasets = build_gpt_datasets(
                prefix, seq_len=cfg.seq_len, seed=cfg.seed, split=cfg.data.split or "969,30,1"
            )
        train, valid, _ = datasets
        self.train_streams = [
            SampleStream(
                train,
                micro_batch_size=cfg.micro_batch_size,
                dp_rank=parallel_state.get_data_parallel_rank(),
                dp_size=parallel_state.get_data_parallel_world_size(),
            )
            for _ in self.chunks
        ]
        self.valid_dataset = valid

    def _prepared_datasets(self, source: PreparedSource) -> list[Any]:
        """GPTDataset splits (a BlendedDataset over several prefixes) of prepared data."""
        cfg = self.config
        sizes: list[int | None] = [None, None, None]
        if cfg.data.train_samples is not None or source.blend.weights is not None:
            if cfg.data.train_samples is None:
                raise ValueError(
                    f"the weighted blend {source.blend} needs config.data.train_samples "
                    "(steps x global batch size: the samples Megatron draws from the blend)"
                )
            eval_samples = (
                cfg.data.eval_micro_batches
                * cfg.micro_batch_size
                * max(1, cfg.data_parallel_size(self.world_size))
            )
            sizes = [cfg.data.train_samples, eval_samples, eval_samples]
        return build_gpt_datasets(
            source.blend,
            seq_len=cfg.seq_len,
            seed=cfg.seed,
            split=cfg.data.split or "98,2,0",
            tokenizer=source.tokenizer,
            sizes=sizes,
        )

    # -- the step ---------------------------------------------------------------------
    def _run_schedule(self, streams: list[Any], forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cfg = self.config
        return get_forward_backward_func()(
            forward_step_func=gpt_forward_step,
            data_iterator=streams if len(streams) > 1 else streams[0],
            model=self.chunks,
            num_microbatches=self.num_microbatches,
            seq_length=cfg.seq_len,
            micro_batch_size=cfg.micro_batch_size,
            decoder_seq_length=cfg.seq_len,
            forward_only=forward_only,
        )

    def _mean_loss(self, reduced: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Token-mean loss over micro-batches and data-parallel ranks (stays on device)."""
        from megatron.core import parallel_state

        if reduced:
            pair = torch.stack([r["lm loss"] for r in reduced]).sum(0)
        else:  # not the last pipeline stage: contributes nothing
            pair = torch.zeros(2, device=self._device)
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(pair, group=parallel_state.get_pipeline_model_parallel_group())
        if parallel_state.get_data_parallel_world_size() > 1:
            dist.all_reduce(pair, group=parallel_state.get_data_parallel_group())
        return pair[0] / pair[1].clamp(min=1)

    def train_step(self, step: int) -> StepOutput:
        from megatron.core.distributed import finalize_model_grads

        assert self.train_streams, "setup() must run before train_step()"
        cfg = self.config
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = self.optimizer.param_groups[0]["lr"]
        if self._moe is not None:
            self._moe.begin_step()
        reduced = self._run_schedule(self.train_streams, forward_only=False)
        finalize_model_grads(self.chunks)
        if self._model_state is not None:  # gradients before clipping, to the watchers
            self._model_state.before_clipping()
        self.checkpoints.wait_for_staging()  # a save still copies what the step changes
        update_successful, grad_norm, _ = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=1)
        metrics: dict[str, Any] = {"lr": lr, "skipped_update": 0.0 if update_successful else 1.0}
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        if self._moe is not None:
            metrics.update(self._moe_metrics())
        return StepOutput(
            loss=self._mean_loss(reduced),
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

    @torch.no_grad()
    def evaluate(self) -> Mapping[str, Any]:
        """Mean loss over the first ``eval_micro_batches`` x micro-batches of the valid split."""
        from megatron.core import parallel_state

        cfg = self.config
        if self.valid_dataset is None or len(self.valid_dataset) == 0:
            raise RuntimeError("no validation split: set config.data.split with a valid share")
        streams = [
            SampleStream(
                self.valid_dataset,
                micro_batch_size=cfg.micro_batch_size,
                dp_rank=parallel_state.get_data_parallel_rank(),
                dp_size=parallel_state.get_data_parallel_world_size(),
            )
            for _ in self.chunks
        ]
        saved, self.num_microbatches = self.num_microbatches, cfg.data.eval_micro_batches
        for chunk in self.chunks:
            chunk.eval()
        try:
            reduced = self._run_schedule(streams, forward_only=True)
        finally:
            self.num_microbatches = saved
            for chunk in self.chunks:
                chunk.train()
        return {"loss": self._mean_loss(reduced)}

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

    def watch_gradients(self, watcher: Callable[[Mapping[str, Any]], None]) -> None:
        """Ability ``gradients``: ``watcher({name: gradient})`` after the gradients are
        reduced and before clipping, with ``model_state``'s names."""
        self.model_state().watch_gradients(watcher)

    # -- silent-corruption checks ------------------------------------------------------
    def gather_weight_checksums(self) -> list[dict[str, str]]:
        """Every rank's checksums of its parameters and replicated optimizer state
        (ability ``weight_checksums``; see ``megatron/checksums.py``)."""
        return [entry or {} for entry in gather(replica_checksums(self.chunks, self.optimizer))]

    @property
    def refused_abilities(self) -> dict[str, str]:
        """Checksums need data-parallel replicas to compare."""
        if not self.chunks or self.config.data_parallel_size(self.world_size) > 1:
            return {}
        return {
            "weight_checksums": "data-parallel size 1: every rank holds its own shard, no "
            "replica to compare; launch more ranks than tensor x pipeline parallel"
        }

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

        self.checkpoints.close()
        if self._moe is not None:
            self._moe.close()
            self._moe = None
        parallel_state.destroy_model_parallel()
        self.chunks, self.train_streams, self._model_state = [], [], None
        self.optimizer = self.scheduler = self.valid_dataset = None
        self.teardown_process_group()
