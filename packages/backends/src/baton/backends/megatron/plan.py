"""A dry run of a Megatron-Core configuration: its parallel layout and size, validated
by the configuration objects alone (no process group, no model, no accelerator).
``MegatronBackend.dry_run`` (the ``dry_run`` ability behind ``baton run RECIPE
--dry-run``) prints it.

Example::

    print(layout_plan(config, world_size=16))
    # world size 16 = tensor 2 x pipeline 4 x data 2 ...
    flops_per_token(config, vocab_size=32000)   # the PaLM estimate, for MFU
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.backends.megatron.config import MegatronConfig


@dataclass(frozen=True)
class Sizes:
    """Parameter counts of a configuration: ``dense`` (attention, norms, dense MLPs,
    embedding and output layer) and ``experts`` (every expert of every MoE layer, and
    the routers), ``active`` the parameters one token uses (its top-k experts)."""

    dense: int
    experts: int
    active: int


def parameter_sizes(config: MegatronConfig) -> Sizes:
    """The parameter counts of ``config``'s model (norms left out: they are tiny)."""
    m = config.model
    vocab = config.padded_vocab_size(0)
    heads, kv = m.num_attention_heads, m.kv_channels or m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or heads
    ffn = m.ffn_hidden_size or 4 * m.hidden_size  # TransformerConfig's own default
    matrices = 3 if m.gated_linear_unit else 2
    attention = m.hidden_size * kv * (heads + 2 * groups) + kv * heads * m.hidden_size
    sparse = moe_layer_count(m)
    dense = (
        m.num_layers * attention
        + (m.num_layers - sparse) * matrices * m.hidden_size * ffn
        + 2 * vocab * m.hidden_size
    )
    expert = matrices * m.hidden_size * (m.moe_ffn_hidden_size or ffn)
    experts = sparse * (m.num_moe_experts or 0) * (expert + m.hidden_size)
    active = dense + sparse * (
        m.moe_router_topk * expert + (m.num_moe_experts or 0) * m.hidden_size
    )
    return Sizes(dense, experts, active)


def moe_layer_count(model: Any) -> int:
    """Layers with experts (Megatron's ``moe_layer_freq``: every n-th, or a 0/1 list)."""
    if not model.num_moe_experts:
        return 0
    freq = model.moe_layer_freq
    if isinstance(freq, int):
        return sum(1 for layer in range(model.num_layers) if layer % freq == 0)
    return sum(freq)


def flops_per_token(config: MegatronConfig, vocab_size: int) -> float:
    """6 x parameters a token uses + attention (the PaLM estimate), over the whole
    model (a MoE layer: its router and the token's top-k experts), with ``vocab_size``
    embedding rows (``MegatronBackend.flops_per_token``)."""
    m = config.model
    h, layers, seq = m.hidden_size, m.num_layers, config.seq_len
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
    return 6.0 * (used + vocab_size * h) + 12.0 * layers * h * seq


def expert_layout(config: MegatronConfig, world_size: int) -> tuple[int, int, int]:
    """(expert parallel, expert tensor parallel, expert data parallel) sizes on
    ``world_size`` ranks; ``ValueError`` for a degree that does not fit."""
    m = config.model
    tp, pp = config.parallel_sizes()
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size or tp
    if ep > 1 and (m.num_moe_experts or 0) % ep:
        raise ValueError(
            f"expert parallel {ep} does not divide the {m.num_moe_experts} experts; pick a "
            "divisor of the expert count"
        )
    ranks = world_size // pp  # the ranks of one pipeline stage
    if ranks % (ep * etp):
        raise ValueError(
            f"expert parallel {ep} x expert tensor parallel {etp} does not divide the "
            f"{ranks} ranks of a pipeline stage (world size {world_size} / pipeline {pp})"
        )
    return ep, etp, ranks // (ep * etp)


def memory_per_rank(config: MegatronConfig, world_size: int, sizes: Sizes) -> float:
    """GiB a rank holds for weights, gradients and optimizer state (no activations):
    weights in their dtype, gradients in fp32 where ``grad_reduce_in_fp32`` (else the
    weights' dtype), fp32 main weights and two Adam moments sharded over the data-parallel
    ranks with the distributed optimizer (the experts over the expert-data-parallel ones)."""
    m = config.model
    tp, pp = config.parallel_sizes()
    dp = config.data_parallel_size(world_size)
    ep, etp, edp = expert_layout(config, world_size)
    weight = 2 if (m.bf16 or m.fp16) else 4
    grad = 4 if config.ddp.grad_reduce_in_fp32 else weight
    state = 12 if weight == 2 else 8  # fp32 main copy (half precision) + two moments
    sharded = config.ddp.use_distributed_optimizer
    dense = sizes.dense / (tp * pp)
    experts = sizes.experts / (ep * etp * pp)
    total = (weight + grad) * (dense + experts)
    total += state * (dense / (dp if sharded else 1) + experts / (edp if sharded else 1))
    return total / 2**30


def layout_plan(config: MegatronConfig, world_size: int) -> str:
    """The layout of ``config`` on ``world_size`` ranks; raises ``ValueError`` naming the
    setting that does not fit (the degrees, the layer split, the micro-batches)."""
    config.check_layout()
    tp, pp = config.parallel_sizes()
    dp = config.data_parallel_size(world_size)
    micro = config.num_microbatches(world_size)
    m = config.model
    vocab = config.padded_vocab_size(0)
    heads, kv = m.num_attention_heads, m.kv_channels or m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or heads
    sizes = parameter_sizes(config)
    params = sizes.dense + sizes.experts
    vpp = m.virtual_pipeline_model_parallel_size or 1
    if m.num_layers % (pp * vpp):
        raise ValueError(
            f"{m.num_layers} layers do not split into pipeline {pp} x virtual {vpp} stages; "
            "choose sizes whose product divides the layer count"
        )
    if vpp > 1 and micro % pp:
        raise ValueError(
            f"the interleaved schedule needs micro-batches ({micro}) divisible by pipeline "
            f"parallel {pp}; change the global or micro batch size"
        )
    rope = f", rope scaling x{config.rope_scaling_factor:g}" if config.rope_scaling else ""
    tokens = config.global_batch_size * config.seq_len
    ep, etp, edp = expert_layout(config, world_size)
    per_rank = sizes.dense / (tp * pp) + sizes.experts / (ep * etp * pp)
    lines = [
        f"model {m.num_layers} layers, hidden {m.hidden_size}, FFN {m.ffn_hidden_size}, "
        f"{heads} heads x {kv} ({groups} KV groups), "
        f"vocab {vocab}, rope base {config.rotary_base:g}{rope}",
        f"world size {world_size} = tensor {tp} x pipeline {pp} x data {dp}",
        f"layers per pipeline stage {m.num_layers // pp} ({vpp} virtual stage(s) of "
        f"{m.num_layers // pp // vpp}); sequence parallel {m.sequence_parallel}",
        f"global batch {config.global_batch_size} = micro {config.micro_batch_size} x "
        f"{micro} micro-batches x data {dp}; {tokens:,} tokens/step",
        f"parameters {params / 1e9:.2f} B; per model-parallel rank {per_rank / 1e9:.2f} B",
    ]
    if m.num_moe_experts:
        experts = m.num_moe_experts
        lines[1] += f"; experts: expert {ep} x expert tensor {etp} x expert data {edp}"
        lines.insert(1, (
            f"experts {experts} in each of {moe_layer_count(m)} MoE layers, top "
            f"{m.moe_router_topk}, FFN {m.moe_ffn_hidden_size}; {experts // ep} experts a rank"
        ))  # fmt: skip
        lines[-1] += f"; active per token {sizes.active / 1e9:.2f} B"
    memory = memory_per_rank(config, world_size, sizes)
    return "\n".join([
        *lines,
        f"memory per rank {memory:.1f} GiB: weights, gradients and optimizer state "
        "(activations not counted)",
        f"bf16 {m.bf16}, distributed optimizer {config.ddp.use_distributed_optimizer}, "
        f"layer spec {config.layer_spec}, vocab {vocab}",
    ])  # fmt: skip
