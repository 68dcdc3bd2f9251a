"""Validate a ``Trainer.Config`` for a given number of GPUs without any GPU: the dry run
(``TorchTitanBackend.dry_run``, the ``dry_run`` ability behind ``baton run RECIPE --dry-run``).

Builds TorchTitan's ``ParallelDims`` (its own degree checks), checks the batch and
sequence divisibility that ``Trainer.__init__`` asserts, builds the model on the
``meta`` device (no memory) for parameter and FLOP counts, and estimates the
per-rank memory of the sharded training state.

Example::

    print(parallelism_plan(llama3_8b_config, world_size=8))
"""

from __future__ import annotations

import re
from typing import Any

_BYTES = {"bfloat16": 2, "float32": 4}


def parallelism_plan(config: Any, world_size: int) -> str:
    """A readable plan; raises ``ValueError`` naming the setting that does not fit."""
    import torch
    from torchtitan.distributed import ParallelDims

    par, training = config.parallelism, config.training
    check_model_layout(config)
    try:
        dims = ParallelDims.from_config(par, world_size)
    except AssertionError as error:
        raise ValueError(f"parallelism does not fit {world_size} ranks: {error}") from error
    sequences = _check_layout(config, dims)
    batch_degree = dims.dp_replicate * dims.dp_shard
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    params, flops = model_config.get_nparams_and_flops(model, training.seq_len)
    shards = dims.dp_shard * dims.cp * dims.tp * dims.pp
    param_bytes = _BYTES[training.dtype]
    # fp32 master weights + grads + two AdamW moments, sharded over FSDP/TP/PP/CP (the
    # experts over EP x its FSDP, the same number of ranks)
    state_gib = params * (param_bytes + 4 + 8) / shards / 2**30
    tokens = sequences * training.seq_len
    lines = [
        f"model        {config.model_spec.name} {config.model_spec.flavor}: "
        f"{params / 1e9:.2f} B parameters, {flops / 1e9:.1f} GFLOP per token",
        f"ranks        {world_size} = dp_replicate {dims.dp_replicate} x dp_shard (FSDP) "
        f"{dims.dp_shard} x cp {dims.cp} x tp {dims.tp} x pp {dims.pp} (ep {dims.ep})"
        + (f", schedule {par.pipeline_parallel_schedule}" if dims.pp > 1 else ""),
        *expert_lines(model, dims),
        f"precision    params {training.mixed_precision_param} in compute, "
        f"{training.dtype} master, reduce {training.mixed_precision_reduce}",
        f"batch        local {training.local_batch_size} x seq {training.seq_len}, "
        f"global {sequences} sequences = {tokens:,} tokens/step, "
        f"grad accumulation {sequences // (training.local_batch_size * batch_degree)}",
        f"compile      {'on: ' + ', '.join(config.compile.components) if config.compile.enable else 'off'}",
        f"act. ckpt    {activation_checkpointing(config.activation_checkpoint)}",
        f"checkpoint   DCP, async_mode={config.checkpoint.async_mode}",
        f"memory       ~{state_gib:.1f} GiB/rank of weights, grads and AdamW state",
        f"train FLOPs  {flops * tokens / 1e15:.2f} PFLOP/step (TorchTitan's FLOPs per token, "
        "active parameters and attention, x tokens)",
    ]
    return "\n".join(lines)


def activation_checkpointing(config: Any) -> str:
    """TorchTitan's activation checkpointing config as the plan names it: ``none``, or
    its class without ``AC`` in words (``SelectiveAC.Config``: ``selective``, ``FullAC``:
    ``full``, ``MemoryBudgetAC``: ``memory budget 0.5``)."""
    if config is None:
        return "none"
    owner = type(config).__qualname__.split(".")[0].removesuffix("AC")
    name = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", owner).lower() or owner
    budget = getattr(config, "memory_budget", None)
    return name if budget is None else f"{name} {budget:g}"


def check_model_layout(config: Any) -> None:
    """Attention and key/value heads by TP, experts by EP, before anything is built
    (``UsageError`` naming the quantity; TorchTitan splits layers over pipeline stages
    unevenly, so they are not checked)."""
    from baton.core.model.parallel_layout import check_parallel_layout

    layers = getattr(config.model_spec.model, "layers", None) or []
    if not layers:
        return
    attention = getattr(layers[0], "attention", None)
    heads = getattr(attention, "n_heads", None)
    fused = getattr(attention, "qkv_linear", None)
    kv_heads = getattr(attention, "n_kv_heads", None) or getattr(fused, "n_kv_heads", None)
    experts = [getattr(getattr(layer, "moe", None), "num_experts", None) for layer in layers]
    par = config.parallelism
    check_parallel_layout(
        heads=heads,
        kv_heads=kv_heads or heads,
        experts=max((e for e in experts if e), default=None),
        tp=par.tensor_parallel_degree,
        ep=par.expert_parallel_degree,
    )


def global_batch(config: Any, dims: Any) -> int:
    """The sequences one optimizer step reads over every data-parallel rank, as
    ``Trainer.__init__`` sizes it: ``training.global_batch_size``, or where it is unset
    (-1) the local batch x the data-parallel degree (``dp_replicate x dp_shard``)."""
    training = config.training
    batch = training.global_batch_size
    if batch < 0:
        batch = training.local_batch_size * dims.dp_replicate * dims.dp_shard
    return int(batch)


def rows_per_step(config: Any, world_size: int) -> int:
    """:func:`global_batch` of ``config`` on ``world_size`` ranks (TorchTitan's
    ``ParallelDims`` resolves ``dp_shard=-1``), before anything is built: the rollouts a
    step of online RL trains on (local batch x data-parallel ranks x gradient
    accumulation)."""
    from torchtitan.distributed import ParallelDims

    try:
        dims = ParallelDims.from_config(config.parallelism, world_size)
    except AssertionError as error:
        raise ValueError(f"parallelism does not fit {world_size} ranks: {error}") from error
    return global_batch(config, dims)


def _check_layout(config: Any, dims: Any) -> int:
    """The global batch in sequences, after the divisibility checks ``Trainer.__init__``
    asserts (batch over data-parallel ranks, sequence over TP/CP, microbatches, stages)."""
    par, training = config.parallelism, config.training
    batch_degree = dims.dp_replicate * dims.dp_shard
    global_batch_size = global_batch(config, dims)
    if global_batch_size % (training.local_batch_size * batch_degree):
        raise ValueError(
            f"training.global_batch_size {global_batch_size} is not a multiple of "
            f"local_batch_size {training.local_batch_size} x data-parallel degree {batch_degree}"
        )
    divisor = (dims.tp if par.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
    if training.seq_len % divisor:
        raise ValueError(f"training.seq_len {training.seq_len} is not divisible by {divisor}")
    if dims.pp > 1:
        micro = par.pipeline_parallel_microbatch_size
        if training.local_batch_size % micro:
            raise ValueError(
                f"training.local_batch_size {training.local_batch_size} is not a multiple of "
                f"parallelism.pipeline_parallel_microbatch_size {micro}"
            )
    layers = len(getattr(config.model_spec.model, "layers", []) or [])
    if dims.pp > 1 and layers and layers < dims.pp:
        raise ValueError(f"pipeline degree {dims.pp} exceeds the model's {layers} layers")
    from baton.backends.torchtitan.moe import expert_parallel_refusal

    refusal = expert_parallel_refusal(config)
    if refusal is not None:
        raise ValueError(refusal)
    return global_batch_size


def expert_lines(model: Any, dims: Any) -> list[str]:
    """The plan's lines on a mixture-of-experts model (none for a dense one): experts per
    rank under expert parallelism, the experts' share of the parameters, the parameters
    a token activates, and one MoE layer's bf16 weights a rank gathers in its forward
    pass (its experts' over EP, the rest over TP)."""
    from torchtitan.models.common.moe import MoE

    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return []
    first = layers[0]
    experts, top_k = first.routed_experts.inner_experts.num_experts, first.router.top_k
    expert_params = sum(
        p.numel() for m in layers for p in m.routed_experts.inner_experts.parameters()
    )
    total = sum(p.numel() for p in model.parameters())
    active = total - expert_params * (1 - top_k / experts)
    layer_experts = sum(p.numel() for p in first.routed_experts.inner_experts.parameters())
    block = next(b for b in model.layers.children() if first in list(b.modules()))
    layer_rest = sum(p.numel() for p in block.parameters()) - layer_experts
    gathered_gib = (layer_experts / dims.ep + layer_rest / dims.tp) * 2 / 2**30
    return [
        f"experts      {experts} per MoE layer x {len(layers)} layers, top {top_k}; ep "
        f"{dims.ep}: {experts // dims.ep} experts/rank, all-to-all over {dims.ep} ranks",
        f"parameters   {expert_params / 1e9:.2f} B in experts, {active / 1e9:.2f} B active "
        "per token",
        f"gathered     ~{gathered_gib:.2f} GiB/rank of one layer's bf16 weights in forward",
    ]
