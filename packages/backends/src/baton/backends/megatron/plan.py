"""A dry run of a Megatron-Core configuration: its parallel layout and size, validated
by the configuration objects alone (no process group, no model, no accelerator).
``MegatronBackend.dry_run`` (the ``dry_run`` ability behind ``baton run RECIPE
--dry-run``) prints it.

Example::

    print(layout_plan(config, world_size=16))
    # world size 16 = tensor 2 x pipeline 4 x data 2 ...
"""

from __future__ import annotations

from baton.backends.megatron.config import MegatronConfig


def layout_plan(config: MegatronConfig, world_size: int) -> str:
    """The layout of ``config`` on ``world_size`` ranks; raises ``ValueError`` naming the
    setting that does not fit (the degrees, the layer split, the micro-batches)."""
    tp, pp = config.parallel_sizes()
    dp = config.data_parallel_size(world_size)
    micro = config.num_microbatches(world_size)
    m = config.model
    vocab = config.padded_vocab_size(0)
    heads, kv = m.num_attention_heads, m.kv_channels or m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or heads
    ffn = m.ffn_hidden_size or 4 * m.hidden_size  # TransformerConfig's own default
    params = (
        m.num_layers
        * (
            m.hidden_size * kv * (heads + 2 * groups)
            + kv * heads * m.hidden_size
            + 3 * m.hidden_size * ffn
        )
        + 2 * vocab * m.hidden_size
    )
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
    return "\n".join(
        [
            f"model {m.num_layers} layers, hidden {m.hidden_size}, FFN {m.ffn_hidden_size}, "
            f"{heads} heads x {kv} ({groups} KV groups), "
            f"vocab {vocab}, rope base {config.rotary_base:g}{rope}",
            f"world size {world_size} = tensor {tp} x pipeline {pp} x data {dp}",
            f"layers per pipeline stage {m.num_layers // pp} ({vpp} virtual stage(s) of "
            f"{m.num_layers // pp // vpp}); sequence parallel {m.sequence_parallel}",
            f"global batch {config.global_batch_size} = micro {config.micro_batch_size} x "
            f"{micro} micro-batches x data {dp}; {tokens:,} tokens/step",
            f"parameters {params / 1e9:.2f} B; per model-parallel rank "
            f"{params / tp / pp / 1e9:.2f} B",
            f"bf16 {m.bf16}, distributed optimizer {config.ddp.use_distributed_optimizer}, "
            f"layer spec {config.layer_spec}, vocab {vocab}",
        ]
    )
