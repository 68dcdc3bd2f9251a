"""The ``model_state`` and ``gradients`` abilities of the Fabric and LightningModule
backends: the shared ``TorchModelState`` over the user's module, its optimizers and
learning-rate schedulers.

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

    state = backend.model_state()
    state.freeze("model.embed_tokens.*")
    backend.model_state().watch_gradients(lambda grads: print(sorted(grads)))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

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
    """Mixed into the Fabric backends: ``model_state()`` and the
    step's ``before_clipping()`` (nothing until a callback asks)."""

    raw_model: nn.Module | None
    _model_state: TorchModelState | None = None
    _model_state_of: tuple[Any, Any] | None = None

    def model_state(self) -> TorchModelState:
        """The run's ``ModelState`` (after ``setup``), built on first use."""
        backend: Any = self  # a FabricBackend
        if self.raw_model is None or backend.model is None:
            raise RuntimeError("model_state() is available after setup()")
        built_for = (self.raw_model, backend.optimizer)
        if self._model_state is None or self._model_state_of != built_for:
            self._model_state_of = built_for
            self._model_state = TorchModelState(
                fabric_entries(self.raw_model, backend.model, rank=backend.rank),
                optimizers=backend.optimizers_stepped(),
                schedulers=backend._schedulers(),
                fetch=backend.fetch,
            )
        return self._model_state

    def optimizers_stepped(self) -> list[Any]:
        """The optimizers the step uses (a LightningModule's may be several)."""
        return [self.optimizer]  # pyright: ignore[reportAttributeAccessIssue]

    def before_clipping(self) -> None:
        """The step's hook: frozen gradients dropped, watchers shown the rest."""
        if self._model_state is not None:
            self._model_state.before_clipping()
