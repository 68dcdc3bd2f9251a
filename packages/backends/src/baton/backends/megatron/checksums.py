"""The ``weight_checksums`` ability of the Megatron backend: bitwise checksums of what the
data-parallel replicas of one model-parallel rank hold alike.

Example::

    from baton.backends.megatron.checksums import replica_checksums

    local = replica_checksums(backend.chunks, backend.optimizer)
    local["decoder.layers.0.mlp.linear_fc1.weight"]          # this rank's checksum
    local["decoder.layers.0.mlp.linear_fc1.weight:exp_avg"]  # ... of Adam's first moment

Every parameter of this rank's model chunks is checksummed (Megatron's DDP keeps them in
contiguous buffers; the parameters are views of them). Without the distributed optimizer
the optimizer state is replicated too: its moments and step, and with a 16-bit model the
fp32 main copy of each parameter (``"<parameter>:main_param"``). The distributed
optimizer shards its state over the data-parallel ranks: only the weights are compared.
With tensor or pipeline parallelism each rank's names carry its coordinates
(``"<parameter>@tp1.pp0"``; ``"chunk1."`` first for a virtual pipeline's second chunk):
ranks are compared with the replicas of their own shard only. Under expert parallelism
an expert is named by its global number, so it is compared across the ranks holding it.
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.megatron.hf import gpt_model
from baton.backends.megatron.moe import global_expert_name
from baton.backends.weight_checksums import optimizer_state_items, tensor_checksums


def named_replicas(chunks: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """``(key, parameter)`` for this rank's parameters, keyed apart per model-parallel shard."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    where = ""
    if tp * pp > 1:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        where = f"@tp{tp_rank}.pp{pp_rank}"
    named: list[tuple[str, torch.Tensor]] = []
    for index, chunk in enumerate(chunks):
        prefix = f"chunk{index}." if index else ""
        module = gpt_model(chunk)
        experts = module.config.num_moe_experts  # experts by global number: each its own
        named += [
            (f"{prefix}{global_expert_name(name, experts)}{where}", p)
            for name, p in module.named_parameters()
        ]
    return named


def replicated_optimizer_items(
    optimizer: Any, names: dict[torch.Tensor, str]
) -> list[tuple[str, Any]]:
    """``("<parameter>:<state>", value)`` for the optimizer state the data-parallel
    replicas hold alike (none of a distributed optimizer's: it is sharded over them)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    items: list[tuple[str, Any]] = []
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(part, DistributedOptimizer):
            continue
        mains = dict(names)
        for model_group, main_group in zip(
            getattr(part, "float16_groups", []),
            getattr(part, "fp32_from_float16_groups", []),
            strict=True,
        ):
            for model_param, main in zip(model_group, main_group, strict=True):
                if model_param in names:
                    mains[main] = names[model_param]
                    items.append((f"{names[model_param]}:main_param", main))
        items += optimizer_state_items(part.optimizer, mains)
    return items


def replica_checksums(chunks: list[Any], optimizer: Any) -> dict[str, str]:
    """This rank's ``{key: checksum}`` of parameters and replicated optimizer state."""
    named = named_replicas(chunks)
    names = {param: key for key, param in named}
    return tensor_checksums([*named, *replicated_optimizer_items(optimizer, names)])
