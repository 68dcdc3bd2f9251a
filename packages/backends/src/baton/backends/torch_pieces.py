"""Where each named torch parameter sits: the entries a ``TorchModelState`` shows.

An ``Entry`` is one name a callback sees: the framework's parameter, the view of its
local tensor that the name covers (the whole tensor, or one part of a fused tensor), the
whole tensor's global shape and this rank's slice of it, and whether this rank's copy is
the one counted in sums over ranks. ``entries_from_parameters`` builds them for ordinary
modules, DTensors (FSDP 2, TP) included::

    entries = entries_from_parameters(
        model.named_parameters(),
        rename=lambda name: name.removeprefix("_orig_mod."),
        counted=dist.get_rank() == 0,          # a data-parallel replica: rank 0 counts
    )

A backend whose framework shards without DTensors (Megatron-Core's tensor-parallel
weights) or fuses tensors (its QKV) builds its entries itself, with ``view`` selecting
the part and ``index`` saying where the part sits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

#: selects a name's part of the parameter's local tensor (and of its gradient)
View = Callable[[torch.Tensor], torch.Tensor]


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The default ``View``: the whole local tensor."""
    return tensor


@dataclass(frozen=True)
class Entry:
    """One shown name of a torch parameter and where its piece sits.

    ``fused`` names the framework's tensor when several entries are views of one
    parameter (they freeze together).
    """

    name: str
    parameter: nn.Parameter
    global_shape: tuple[int, ...]
    index: tuple[slice, ...]
    counted: bool = True
    fused: str | None = None
    view: View = field(default=whole, compare=False)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This entry's piece of ``tensor`` (the parameter, or its gradient): the local
        shard of a DTensor, then ``view``; detached, sharing storage."""
        return self.view(local_tensor(tensor).detach())


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return tensor.to_local()
    return tensor


def local_gradient(parameter: torch.Tensor) -> torch.Tensor | None:
    """``parameter.grad`` laid out like the parameter (a DTensor gradient whose placements
    differ, e.g. still partial, is redistributed first), as the local tensor."""
    from torch.distributed.tensor import DTensor

    grad = parameter.grad
    if grad is None:
        return None
    if isinstance(grad, DTensor) and isinstance(parameter, DTensor):
        if tuple(grad.placements) != tuple(parameter.placements):
            grad = grad.redistribute(parameter.device_mesh, parameter.placements)
    return local_tensor(grad)


def layout(parameter: torch.Tensor) -> tuple[tuple[int, ...], tuple[slice, ...], bool]:
    """``(global_shape, index, counted)`` of ``parameter`` on this rank.

    A DTensor's slice comes from its mesh and placements; it is counted on the first
    coordinate of every mesh dimension it is replicated over. A plain tensor is whole
    and counted (the caller decides about data-parallel replicas).
    """
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(parameter, DTensor):
        shape = tuple(parameter.shape)
        return shape, tuple(slice(0, n) for n in shape), True
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = parameter.device_mesh
    shape = tuple(parameter.shape)
    local_shape, offset = compute_local_shape_and_global_offset(
        parameter.shape, mesh, parameter.placements
    )
    index = tuple(slice(o, o + n) for o, n in zip(offset, local_shape, strict=True))
    coordinate = mesh.get_coordinate() or [0] * mesh.ndim
    counted = all(
        coordinate[dim] == 0
        for dim, placement in enumerate(parameter.placements)
        if isinstance(placement, Replicate) or not placement.is_shard()
    )
    return shape, index, counted


def entries_from_parameters(
    named_parameters: Iterable[tuple[str, nn.Parameter]],
    *,
    rename: Callable[[str], str | None] | None = None,
    counted: bool = True,
) -> list[Entry]:
    """One entry per parameter, named ``rename(name)`` (left out where it returns
    ``None``), laid out by ``layout``; ``counted=False`` marks every piece of this rank
    as a replica that another rank counts. Parameters seen twice (tied weights) are
    shown once, under their first name."""
    entries: list[Entry] = []
    seen: set[int] = set()
    for name, parameter in named_parameters:
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        shown = rename(name) if rename is not None else name
        if shown is None:
            continue
        shape, index, own = layout(parameter)
        entries.append(Entry(shown, parameter, shape, index, counted=counted and own))
    return entries


def strip_wrappers(name: str) -> str:
    """A parameter's name without the parts wrappers insert: ``torch.compile``'s
    ``_orig_mod.``, activation checkpointing's ``_checkpoint_wrapped_module.`` and FSDP 1's
    ``_fsdp_wrapped_module.``.

    >>> strip_wrappers("_orig_mod.layers.0._checkpoint_wrapped_module.w")
    'layers.0.w'
    """
    inner = {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}
    return ".".join(part for part in name.split(".") if part not in inner)
