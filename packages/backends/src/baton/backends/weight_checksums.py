"""Bitwise checksums of a torch model's parameters and optimizer state, gathered from
every rank: the ``weight_checksums`` ability of the torch backends (``CorruptionCheck``
compares them across data-parallel replicas, and between the two runs of a replayed step).

Example::

    from baton.backends.weight_checksums import gather_weight_checksums

    per_rank = gather_weight_checksums(model, optimizer)   # every rank, at the same step
    per_rank[1]["layer.weight"]                  # rank 1's checksum of that parameter
    per_rank[1]["layer.weight:exp_avg"]          # ... of Adam's first moment of it

A tensor's checksum is the 64-bit wrapping sum of its bits read as integers of its
element size, computed where the tensor lives (one device-to-host transfer for all):
any single flipped bit changes it. Optimizer state is keyed ``"<parameter>:<state>"``
(``exp_avg``, ``exp_avg_sq``, ``step``...; a number that is not a tensor is checksummed
from its text). Only what every rank holds whole (replicated under data parallelism)
is comparable; sharded parameters differ by design.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: the integer type with each floating element size, to read a parameter's bits
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_checksums(named: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """``{name: 16 hex digits}`` for ``(name, tensor or number)`` pairs (one transfer to
    the host per device the tensors are on)."""
    by_device: dict[torch.device, tuple[list[str], list[torch.Tensor]]] = {}
    found: dict[str, str] = {}
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            found[name] = hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()
            continue
        flat = value.detach().contiguous().view(-1)
        names, sums = by_device.setdefault(flat.device, ([], []))
        sums.append(flat.view(_BITS[flat.element_size()]).sum(dtype=torch.int64))
        names.append(name)
    for names, sums in by_device.values():
        values = torch.stack(sums).cpu().tolist()
        found.update((n, f"{v & (2**64 - 1):016x}") for n, v in zip(names, values, strict=True))
    return found


def weight_checksums(model: nn.Module) -> dict[str, str]:
    """This rank's ``{parameter name: 16 hex digits}`` for every parameter of ``model``."""
    return tensor_checksums(model.named_parameters())


def optimizer_state_items(
    optimizer: torch.optim.Optimizer, names: Mapping[torch.Tensor, str]
) -> list[tuple[str, Any]]:
    """``("<parameter>:<state>", value)`` for each state entry of the parameters named in
    ``names`` (the parameter tensor -> its name); others are left out."""
    items: list[tuple[str, Any]] = []
    for param, state in optimizer.state.items():
        name = names.get(param)
        if name is None:
            continue
        items += [(f"{name}:{key}", value) for key, value in sorted(state.items())]
    return items


def state_checksums(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, str]:
    """``weight_checksums(model)`` plus the checksums of ``optimizer``'s state of those
    parameters (keyed ``"<parameter>:<state>"``)."""
    named = list(model.named_parameters())
    if optimizer is not None:
        names = {param: name for name, param in named}
        named += optimizer_state_items(optimizer, names)
    return tensor_checksums(named)


def gather(local: Any) -> list[Any]:
    """``local`` from every rank, indexed by rank (one all-gather of Python objects; the
    local value alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


def gather_weight_checksums(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, sharded: bool = False
) -> list[dict[str, str]]:
    """Every rank's ``state_checksums(model, optimizer)``, indexed by rank. A
    ``sharded`` model (FSDP) is refused: its ranks hold different parts by design."""
    if sharded:
        raise RuntimeError(
            "weight checksums compare data-parallel replicas, but this strategy shards "
            "the parameters; use CorruptionCheck with DDP"
        )
    return [entry or {} for entry in gather(state_checksums(model, optimizer))]
