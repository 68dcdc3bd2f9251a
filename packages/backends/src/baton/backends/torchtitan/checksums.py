"""The ``weight_checksums`` ability of the TorchTitan backend: bitwise checksums of what
the ranks of one data-parallel replicate group (``dp_replicate``: HSDP, or DDP-like with
``dp_shard`` 1) hold alike.

Example::

    from baton.backends.torchtitan.checksums import replica_checksums, replica_refusal

    replica_refusal(trainer.parallel_dims)    # None, or why nothing is replicated
    local = replica_checksums(trainer)        # {"layers.0.attention.wq.weight@0": ...}

Each parameter's local part (``DTensor.to_local()``) and the optimizer state of it
(Adam's moments and step, also local parts) are checksummed. The ranks of a replicate
group hold the same parts; the parts of other groups (``dp_shard``, ``cp``, ``tp``,
``pp`` coordinates) differ by design, so each key carries the rank's coordinates on
every dimension but ``dp_replicate`` (``"@<shard>"``: ranks are compared with their own
replicas only). TorchTitan's world mesh orders its dimensions ``pp, dp_replicate,
dp_shard, cp, tp``, so a rank's replica-free coordinates are ``(rank // (replicate x
inner), rank % inner)`` with ``inner = dp_shard x cp x tp``.
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.weight_checksums import tensor_checksums


def replica_refusal(dims: Any) -> str | None:
    """Why this layout has no replica to compare (``None`` if it has one)."""
    if dims.dp_replicate > 1:
        return None
    return (
        "dp_replicate is 1: no rank holds a replica of another's parameters (dp_shard "
        "shards them); set parallelism.data_parallel_replicate_degree > 1 (HSDP) to "
        "check replicas"
    )


def _local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value


def shard_suffix(dims: Any, rank: int) -> str:
    """``"@<shard>"``: this rank's coordinates apart from ``dp_replicate`` (``""`` when
    every rank holds whole parameters)."""
    inner = dims.dp_shard * dims.cp * dims.tp
    if inner * dims.pp == 1:
        return ""
    stage, within = divmod(rank, dims.dp_replicate * inner)
    return f"@{stage * inner + within % inner}"


def replica_checksums(trainer: Any, rank: int) -> dict[str, str]:
    """This rank's ``{key: checksum}`` of parameters and optimizer state (local parts)."""
    suffix = shard_suffix(trainer.parallel_dims, rank)
    named: list[tuple[str, Any]] = []
    names: dict[torch.Tensor, str] = {}
    for index, part in enumerate(trainer.model_parts):
        prefix = f"part{index}." if index else ""
        for name, param in part.named_parameters():
            key = f"{prefix}{name}{suffix}"
            names[param] = key
            named.append((key, _local(param)))
    for optimizer in getattr(trainer.optimizers, "optimizers", []):
        for param, state in optimizer.state.items():
            if param in names:
                named += [(f"{names[param]}:{k}", _local(v)) for k, v in sorted(state.items())]
    return tensor_checksums(named)
