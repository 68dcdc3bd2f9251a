"""Bitwise checksums of a torch model's parameters, gathered from every rank: the
``weight_checksums`` ability of the torch backends (``CorruptionCheck`` compares them
across data-parallel replicas).

Example::

    from baton.backends.weight_checksums import gather_weight_checksums

    per_rank = gather_weight_checksums(model)   # every rank calls it at the same step
    per_rank[1]["layer.weight"]                  # rank 1's checksum of that parameter

A parameter's checksum is the 64-bit wrapping sum of its bits read as integers of its
element size, computed where the parameter lives (one device-to-host transfer for all):
any single flipped bit changes it. Only what every rank holds whole (replicated under
data parallelism) is comparable; sharded parameters differ by design.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

#: the integer type with each floating element size, to read a parameter's bits
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weight_checksums(model: nn.Module) -> dict[str, str]:
    """This rank's ``{parameter name: 16 hex digits}`` for every parameter of ``model``."""
    names, sums = [], []
    for name, param in model.named_parameters():
        flat = param.detach().contiguous().view(-1)
        sums.append(flat.view(_BITS[flat.element_size()]).sum(dtype=torch.int64))
        names.append(name)
    if not sums:
        return {}
    values = torch.stack(sums).cpu().tolist()
    return {name: f"{value & (2**64 - 1):016x}" for name, value in zip(names, values, strict=True)}


def gather_weight_checksums(model: nn.Module, *, sharded: bool = False) -> list[dict[str, str]]:
    """Every rank's ``weight_checksums(model)``, indexed by rank (one small all-gather of
    Python objects; the local result alone without a process group). A ``sharded``
    model (FSDP) is refused: its ranks hold different parts by design."""
    if sharded:
        raise RuntimeError(
            "weight checksums compare data-parallel replicas, but this strategy shards "
            "the parameters; use CorruptionCheck with DDP"
        )
    local = weight_checksums(model)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [entry or {} for entry in gathered]
