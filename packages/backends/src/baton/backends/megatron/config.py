"""The Megatron backend's configuration: Megatron-Core's own config objects plus a few
settings of the run (batch sizes, schedule, data), all editable in ``on_configure``.

``model`` is a ``megatron.core.transformer.TransformerConfig``: its parallel sizes
(``tensor_model_parallel_size``, ``pipeline_model_parallel_size``), dtypes and
shape are Megatron's fields; ``optimizer`` is an ``OptimizerConfig`` (its ``lr`` and
``min_lr`` bound the schedule), ``ddp`` a ``DistributedDataParallelConfig``.

Example::

    from megatron.core.transformer import TransformerConfig

    from baton.backends.megatron import MegatronConfig
    from baton.core.objectives import ObjectiveRun

    config = MegatronConfig(
        model=TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4),
        seq_len=64, micro_batch_size=4, global_batch_size=8,
    )
    config.optimizer.lr = 3e-3          # native objects, edited in place
    config.objective = ObjectiveRun.of(objective)   # a recipe's --objective and its settings
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig

from baton.core.errors import UsageError
from baton.core.model.spec import LlamaSpec
from baton.core.objectives import DataKind, ObjectiveRun
from baton.core.objectives.pretrain import PRETRAIN


def tiny_transformer_config(**overrides: Any) -> TransformerConfig:
    """A 2-layer, 64-wide GPT block config that trains on CPU in milliseconds per step."""
    values: dict[str, Any] = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=256,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def default_optimizer_config() -> OptimizerConfig:
    return OptimizerConfig(
        optimizer="adam",
        lr=1e-3,
        min_lr=1e-4,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        clip_grad=1.0,
    )


@dataclass
class DataConfig:
    """Where tokens come from.

    ``data_path`` set: prepared datasets (``baton data prepare``), one prefix or a blend
    ``"0.7 PREFIX_A 0.3 PREFIX_B"``, read through Megatron's ``GPTDataset`` /
    ``BlendedDataset`` with the Hugging Face tokenizer in ``tokenizer`` (a local
    directory). Otherwise ``kind="text"``: a local UTF-8 file (``text_path``; ``None`` is
    the Python language reference shipped with CPython) tokenized to bytes, written as
    Megatron's indexed dataset under ``cache_dir``. ``kind="mock"``: Megatron's
    ``MockGPTDataset`` (synthetic tokens, for benchmarks only).
    """

    kind: Literal["text", "mock"] = "text"
    text_path: str | None = None
    #: a prepared prefix or a blend of them (needs ``tokenizer``)
    data_path: str | None = None
    #: a local Hugging Face tokenizer directory (the one the data was prepared with)
    tokenizer: str | None = None
    #: training samples to draw (Megatron's ``train_samples``: steps x global batch);
    #: ``None``: one epoch, repeated. A weighted blend needs it.
    train_samples: int | None = None
    cache_dir: str = "runs/.megatron-data"
    #: train, valid, test shares of the documents (``None``: ``969,30,1`` for the byte
    #: corpus, ``98,2,0`` for prepared data, whose sized splits must not be empty)
    split: str | None = None
    eval_micro_batches: int = 4
    #: post-training: the fraction of the packed rows held out for evaluation (the last
    #: ones; 0: none, every row trains)
    eval_split: float = 0.0
    #: post-training: other prepared data of the same kind to evaluate on
    eval_data_path: str | None = None


@dataclass
class MegatronConfig:
    """Everything the Megatron backend builds from."""

    model: TransformerConfig = field(default_factory=tiny_transformer_config)
    optimizer: OptimizerConfig = field(default_factory=default_optimizer_config)
    ddp: DistributedDataParallelConfig = field(default_factory=DistributedDataParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    seq_len: int = 64
    micro_batch_size: int = 4
    #: samples per optimizer step over all data-parallel ranks (micro-batches accumulate)
    global_batch_size: int = 8
    #: the model's embedding rows: the tokenizer's vocabulary rounded up to a multiple of
    #: this times the tensor-parallel size
    make_vocab_size_divisible_by: int = 64
    #: model vocabulary before padding (``None``: the byte tokenizer's 257); set it to a
    #: real model's size (Llama 3: 128256) to build that shape
    vocab_size: int | None = None
    #: ``local`` (plain PyTorch layers), ``transformer_engine``, or ``auto`` (TE when it
    #: is installed and a GPU is present)
    layer_spec: Literal["auto", "local", "transformer_engine"] = "auto"
    position_embedding_type: Literal["learned_absolute", "rope"] = "learned_absolute"
    share_embeddings_and_output_weights: bool = True
    #: rotary base (theta) of ``position_embedding_type="rope"``
    rotary_base: float = 10000.0
    #: Llama 3.x rotary scaling (Megatron's ``rope_scaling``; its low/high frequency
    #: factors and original length are Llama 3.1's 1, 4 and 8192) by ``rope_scaling_factor``
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    warmup_steps: int = 10
    #: steps over which the LR decays to ``optimizer.min_lr`` (``None``: constant after warmup)
    decay_steps: int | None = None
    decay_style: Literal["cosine", "linear", "constant", "inverse-square-root"] = "cosine"
    seed: int = 1234
    #: start from the weights of this checkpoint (a baton checkpoint directory or its
    #: ``backend/`` folder), with a fresh optimizer, schedule and data position
    init_from: str | None = None
    #: ``gloo``, ``nccl`` or ``auto`` (nccl with GPUs), used when baton creates the group
    dist_backend: str = "auto"
    #: the shared model spec the model is built from (``hf.use_spec`` sets it): its
    #: parameters are then shown by their Hugging Face names (``model_state``)
    spec: LlamaSpec | None = None
    #: what a step minimises and the values of its settings (``baton.core.objectives``):
    #: an objective on pretraining text runs Megatron's own windows and loss; one on
    #: packed rows (conversations, preference pairs) or on rollouts (one a row) runs them
    #: under a block-causal mask (``objective.py``)
    objective: ObjectiveRun = field(default_factory=lambda: ObjectiveRun.of(PRETRAIN))

    @property
    def packed_rows(self) -> bool:
        """Whether the objective trains on rows of documents (packed by ``baton data
        prepare --seq-len``, or one rollout a row) instead of windows of pretraining
        text."""
        return self.objective.objective.data is not DataKind.TEXT

    @property
    def rollouts(self) -> bool:
        """Whether the objective trains on each step's rollouts (online RL: the rollout
        phase's rows, ``rollout_rows.py``) rather than on rows of prepared data."""
        return self.objective.objective.rollouts

    @property
    def holds_rows_out(self) -> bool:
        """Whether the run has rows to evaluate on: packed rows held out (``eval_split``)
        or other prepared data (``eval_data_path``), or a validation share of the
        documents in Megatron's ``split`` of pretraining text (the byte corpus and the
        mock data have one by default, prepared data none unless asked). Rollouts have
        none: they are sampled each step."""
        data = self.data
        if self.rollouts:
            return False
        if self.packed_rows:
            return bool(data.eval_split or data.eval_data_path)
        if data.data_path is None:
            return True
        shares = (data.split or "98,2,0").split(",")
        return len(shares) > 1 and float(shares[1]) > 0

    def parallel_sizes(self) -> tuple[int, int]:
        """(tensor parallel, pipeline parallel) sizes from the model config."""
        return (
            self.model.tensor_model_parallel_size,
            self.model.pipeline_model_parallel_size,
        )

    def check_layout(self) -> None:
        """Heads and query groups by TP, layers by PP (x VPP), experts by EP, checked
        before anything is built (``UsageError`` naming the quantity)."""
        from baton.core.model.parallel_layout import check_parallel_layout

        model = self.model
        uneven = any(
            getattr(model, name, None)
            for name in (
                "num_layers_in_first_pipeline_stage",
                "num_layers_in_last_pipeline_stage",
                "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split",
                "pipeline_model_parallel_layout",
            )
        )
        tp, pp = self.parallel_sizes()
        check_parallel_layout(
            heads=model.num_attention_heads,
            kv_heads=model.num_query_groups or model.num_attention_heads,
            layers=None if uneven else model.num_layers,
            experts=model.num_moe_experts,
            tp=tp,
            pp=pp,
            vpp=model.virtual_pipeline_model_parallel_size or 1,
            ep=model.expert_model_parallel_size,
        )

    def data_parallel_size(self, world_size: int) -> int:
        tp, pp = self.parallel_sizes()
        if world_size % (tp * pp):
            raise UsageError(
                f"world size {world_size} is not divisible by tensor parallel {tp} x pipeline "
                f"parallel {pp}; launch a multiple of {tp * pp} processes or change the sizes"
            )
        return world_size // (tp * pp)

    def num_microbatches(self, world_size: int) -> int:
        dp = self.data_parallel_size(world_size)
        per_step = self.micro_batch_size * dp
        if self.global_batch_size % per_step:
            raise UsageError(
                f"--global-batch-size {self.global_batch_size} is not a multiple of "
                f"--batch-size {self.micro_batch_size} x data-parallel ranks {dp}; pass "
                f"--global-batch-size {per_step} (or a multiple of it)"
            )
        return self.global_batch_size // per_step

    def padded_vocab_size(self, vocab_size: int) -> int:
        vocab_size = self.vocab_size or vocab_size
        multiple = self.make_vocab_size_divisible_by * self.model.tensor_model_parallel_size
        return -(-vocab_size // multiple) * multiple

    def describe(self) -> dict[str, Any]:
        """Shape facts a resumed run must share (recorded in each checkpoint). The parallel
        layout is not one of them: the backend reshards or refuses it on load."""
        m = self.model
        return {
            "num_layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads,
            "num_query_groups": m.num_query_groups,
            "ffn_hidden_size": m.ffn_hidden_size,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
        }
