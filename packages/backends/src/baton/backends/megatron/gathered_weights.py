"""The model's current weights as whole tensors by their Hugging Face names on global rank
0: the collective a rollout phase calls for its generator (``baton.backends.rollouts.phase``:
the generator loads the policy's weights by name; the runtime's ``broadcast`` then sends
its batch to every rank).

``gather_hf_weights`` reads this rank's parameters as ``named_params`` lays them out
(Megatron's global names, each tensor-parallel shard's slice of the global tensor, a
gated ``linear_fc1`` as its gate and up halves, each split over the tensor-parallel
ranks on its own; one counted holder among data-parallel replicas and none for the last
stage's copy of a tied embedding), sends the counted pieces of every rank (every
tensor-parallel rank, pipeline stage and expert-parallel rank) to global rank 0, which
puts each global tensor together and maps them with ``hf.megatron_to_hf``: the mapping
``baton export`` writes (the fused q/k/v split by query group, ``linear_fc1`` into
``gate_proj`` / ``up_proj``), so the names and shapes are the export's. Nothing is
written. The pieces travel as host tensors in one ``gather_object``: the model's size
passes through global rank 0's host memory, which the generator there holds anyway.

Example::

    weights = gather_hf_weights(backend.chunks, spec)   # every rank calls it
    if weights is not None:                             # global rank 0
        generator.load_weights(weights, version=step)
    batch = backend.broadcast(batch if rank == 0 else None)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from baton.backends.megatron.hf import megatron_to_hf
from baton.backends.megatron.named_params import named_entries
from baton.core.model.spec import ModelSpec

#: a counted piece: Megatron's global name, the global shape, this piece's slice, values
Piece = tuple[str, tuple[int, ...], tuple[slice, ...], torch.Tensor]
#: the suffixes ``named_params`` gives a gated ``linear_fc1``'s halves
GATE, UP = ".gate", ".up"


def local_pieces(chunks: list[Any]) -> list[Piece]:
    """This rank's counted pieces of the model's global tensors, copied to the host."""
    return [
        (
            entry.name,
            entry.global_shape,
            entry.index,
            entry.local(entry.parameter).to("cpu", copy=True),
        )
        for entry in named_entries(chunks, spec=None)
        if entry.counted
    ]


def assemble(pieces: list[Piece]) -> dict[str, torch.Tensor]:
    """Global Megatron tensors from every rank's pieces (a gated ``linear_fc1`` whole
    again: gate over up)."""
    full: dict[str, torch.Tensor] = {}
    for name, shape, index, value in pieces:
        if name not in full:
            full[name] = torch.empty(shape, dtype=value.dtype)
        full[name][index] = value
    for name in [name for name in full if name.endswith(GATE)]:
        fused = name.removesuffix(GATE)
        full[fused] = torch.cat([full.pop(name), full.pop(fused + UP)], dim=0)
    return full


def gather_hf_weights(chunks: list[Any], spec: ModelSpec) -> dict[str, torch.Tensor] | None:
    """The model's weights as whole tensors by their Hugging Face names on global rank 0
    (``None`` on the other ranks); a collective: every rank calls it."""
    pieces = local_pieces(chunks)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world == 1:
        return megatron_to_hf(assemble(pieces), spec)
    first = dist.get_rank() == 0
    gathered: list[Any] | None = [None] * world if first else None
    dist.gather_object(pieces, gathered, dst=0)
    if gathered is None:
        return None
    return megatron_to_hf(assemble([piece for part in gathered for piece in part]), spec)
