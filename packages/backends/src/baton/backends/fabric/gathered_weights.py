"""The model's current weights as whole tensors by their Hugging Face names on global rank
0, and an object sent from global rank 0 to every rank: the two collectives a rollout
phase calls (``baton.backends.rollouts.phase``: its generator loads the policy's weights
by name; its batch reaches every rank).

Names are the module's own (a ``transformers`` model's are Hugging Face's), without the
parts wrappers insert (``torch_pieces.strip_wrappers``), and without the weights tied to
others (``export.tied_names``: a ``lm_head`` sharing the embedding): the names and tensors
``baton export`` writes, as the ``transformers`` model holds them in memory (a
Qwen3-MoE's experts fused, the layout a generator built from the same config holds;
``export.saved_layout`` of them is the export's per-expert files). Nothing is written.

- one process and DDP: every rank holds the whole model; rank 0 hands out its own
  tensors (no communication; they are the live weights, valid until the next optimizer
  step: a generator copies them);
- FSDP (``fsdp``, ``ModelParallelStrategy``): a collective over every rank
  (``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
  ``full_state_dict``; on an accelerator with ``cpu_offload``: whole host tensors on
  rank 0 only), kept on rank 0.

Example::

    weights = gather_hf_weights(backend.parts, sharded=runtime.sharded, rank=runtime.rank)
    if weights is not None:                                   # global rank 0
        generator.load_weights(weights, version=step)
    batch = broadcast_object(fabric, batch if rank == 0 else None)
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.fabric.export import tied_names
from baton.backends.fabric.runtime import TrainingParts
from baton.backends.torch_pieces import strip_wrappers


def full_state_dict(parts: TrainingParts, *, sharded: bool, rank: int) -> dict[str, Any] | None:
    """The model's state dict with whole tensors on rank 0 (``None`` elsewhere); under a
    sharded strategy a collective every rank calls."""
    if not sharded:
        return parts.raw_model.state_dict() if rank == 0 else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # the module as the strategy wrapped it: FSDP 1's root holds the unwrapped parameters
    module = getattr(parts.model, "_forward_module", parts.model)
    # on an accelerator the whole tensors come to rank 0's host only; a model already on
    # the host is gathered on every rank (FSDP 1's offload of host tensors crashes)
    on_host = all(p.device.type == "cpu" for p in module.parameters())
    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_host)
    state = get_model_state_dict(module, options=options)
    return state if rank == 0 else None


def gather_hf_weights(
    parts: TrainingParts, *, sharded: bool, rank: int
) -> dict[str, torch.Tensor] | None:
    """The model's weights as whole tensors by their Hugging Face names on global rank 0
    (``None`` on the other ranks); see the module's text."""
    state = full_state_dict(parts, sharded=sharded, rank=rank)
    if state is None:
        return None
    tied = tied_names(parts.raw_model)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        shown = strip_wrappers(name)
        if shown not in tied and isinstance(tensor, torch.Tensor):
            out[shown] = tensor.detach()
    return out


def broadcast_object(fabric: Any, value: Any) -> Any:
    """Global rank 0's ``value`` on every rank (a collective: every rank calls it)."""
    if fabric.world_size == 1:
        return value
    return fabric.broadcast(value, src=0)
