"""The ``model_state`` ability of the Fabric and LightningModule backends: the shared
``TorchModelState`` over the user's module, its optimizers and learning-rate schedulers.

Names are the module's own (``named_parameters()`` without the wrappers' prefixes): a
Hugging Face model, as ``recipes/hf_finetune.py`` builds, shows the Hugging Face names
(``model.layers.0.self_attn.q_proj.weight``). Layouts:

- one process, DDP: each rank holds the whole tensor; only rank 0's copy is counted;
- ``ModelParallelStrategy`` (FSDP 2 / TP through DTensors): each rank's local shard,
  placed by its mesh (``torch_pieces.layout``);
- ``fsdp`` (FSDP 1, ``use_orig_params``): each rank holds a flat run of elements of each
  parameter: the piece is 1-D, ``global_shape`` is ``(numel,)`` and ``index`` the run.

The step calls ``before_clipping()`` after the last backward of the accumulation window
(gradients reduced) and before ``clip_gradients``: frozen gradients are dropped there
and the watchers see the rest. ``set_hyperparameter("lr", x)`` sets the groups' rate and
scales the schedulers' ``base_lrs`` (see ``baton.backends.torch_model_state``); with a
LightningModule, the schedulers are those ``configure_optimizers`` returned.

Example::

    state = backend.model_state()      # FabricModelState.view()
    state.freeze("model.embed_tokens.*")
    backend.model_state().watch_gradients(lambda grads: print(sorted(grads)))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from baton.backends.fabric.runtime import TrainingParts
from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import Entry, layout, strip_wrappers

Watcher = Callable[[Mapping[str, Any]], None]


def fabric_entries(module: nn.Module, wrapped: nn.Module, *, rank: int) -> list[Entry]:
    """One entry per parameter of the user's ``module`` laid out as Fabric's strategy
    holds it (``wrapped``: the module as Fabric set it up)."""
    entries: list[Entry] = []
    seen: set[int] = set()
    flat = dict(_fsdp1_runs(wrapped))
    for name, parameter in module.named_parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        shown = strip_wrappers(name)
        if id(parameter) in flat:
            numel, start, stop = flat[id(parameter)]
            entry = Entry(shown, parameter, (numel,), (slice(start, stop),), view=_flat)
        else:  # a DTensor's shard, or a whole tensor that only rank 0 counts (DDP)
            shape, index, own = layout(parameter)
            counted = own if _is_dtensor(parameter) else rank == 0
            entry = Entry(shown, parameter, shape, index, counted=counted)
        entries.append(entry)
    return entries


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1)


def _fsdp1_runs(module: nn.Module) -> Iterator[tuple[int, tuple[int, int, int]]]:
    """``id(parameter) -> (numel, start, stop)`` for the original parameters FSDP 1 keeps
    as flat views of this rank's shard (``use_orig_params``): the run of the
    parameter's elements this rank holds (``start == stop`` when none)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    for fsdp in FullyShardedDataParallel.fsdp_modules(module):
        handle = fsdp._handle  # pyright: ignore[reportPrivateUsage]
        if handle is None:
            continue
        flat = handle.flat_param
        infos = flat._shard_param_infos  # pyright: ignore[reportAttributeAccessIssue]
        for parameter, info, numel in zip(
            flat._params,  # pyright: ignore[reportAttributeAccessIssue]
            infos,
            flat._numels,  # pyright: ignore[reportAttributeAccessIssue]
            strict=True,
        ):
            if info.in_shard:
                start, stop = info.intra_param_start_idx, info.intra_param_end_idx + 1
            else:
                start = stop = 0
            yield id(parameter), (numel, start, stop)


class FabricModelState:
    """The model-state view of one Fabric run (ability ``model_state``), owned by its
    backend: ``view()`` is what ``model_state()`` returns, ``before_clipping()`` the
    step's hook (nothing until a callback asks for the view).

    Args:
        parts: returns the run's ``TrainingParts`` (``None`` before ``setup``): the
            user's module, the module as Fabric set it up, every optimizer the step
            uses and the schedulers stepped with them.
        rank: returns this process's global rank.
        fetch: brings tensors to the host in one transfer.

    Example::

        state = FabricModelState(lambda: backend.parts, lambda: runtime.rank, runtime.fetch)
        state.view().freeze("model.embed_tokens.*")
        state.before_clipping()              # in the step, before clip_gradients
    """

    def __init__(
        self,
        parts: Callable[[], TrainingParts | None],
        rank: Callable[[], int],
        fetch: Callable[[Mapping[str, Any]], dict[str, float]],
    ) -> None:
        self._parts = parts
        self._rank = rank
        self._fetch = fetch
        self._view: TorchModelState | None = None
        self._view_of: TrainingParts | None = None

    def view(self) -> TorchModelState:
        """The run's ``ModelState`` (after ``setup``), built on first use and again for
        the parts of a next ``setup``."""
        parts = self._parts()
        if parts is None:
            raise RuntimeError("model_state() is available after setup()")
        if self._view is None or self._view_of is not parts:
            self._view_of = parts
            self._view = TorchModelState(
                fabric_entries(parts.raw_model, parts.model, rank=self._rank()),
                optimizers=list(parts.optimizers),
                schedulers=list(parts.schedulers),
                fetch=self._fetch,
            )
        return self._view

    def before_clipping(self) -> None:
        """The step's hook: frozen gradients dropped, watchers shown the rest."""
        if self._view is not None:
            self._view.before_clipping()
