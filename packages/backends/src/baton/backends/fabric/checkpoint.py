"""Host copies for the Fabric backend's asynchronous save.

Everything a save writes is copied to host memory when the save starts, except the
tensors only the optimizer step changes (parameters, optimizer state): those are left
as ``DeferredCopy`` and copied on the writer thread while the next step's forward and
backward run; the optimizer step waits until that copy is taken (a pre-step hook on
the optimizer and a ``StagingGate``). Code that writes the weights outside the
optimizer step right after an asynchronous save (a callback editing parameters)
calls the backend's ``_wait_for_staging()`` first.

Example::

    staged = host_copy(state, defer=step_owned_storage(model, optimizer))
    ...                          # on the writer thread
    torch.save(finish_host_copy(staged), path)
"""

from __future__ import annotations

import copy
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric.weights import HF_CONFIG_DIR


def host_copy(value: Any, defer: AbstractSet[int] = frozenset()) -> Any:
    """A deep copy with every tensor cloned into host memory, except tensors whose storage
    address is in ``defer``: those stay live, wrapped for ``finish_host_copy``."""
    if isinstance(value, torch.Tensor):
        if value.numel() and value.untyped_storage().data_ptr() in defer:
            return DeferredCopy(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v, defer) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(host_copy(v, defer) for v in value)
    return value


@dataclass(frozen=True)
class DeferredCopy:
    """A live tensor whose host copy ``host_copy`` left for later."""

    tensor: torch.Tensor


def finish_host_copy(value: Any) -> Any:
    """``value`` with every ``DeferredCopy`` tensor copied into host memory."""
    if isinstance(value, DeferredCopy):
        return value.tensor.to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: finish_host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(finish_host_copy(v) for v in value)
    return value


def step_owned_storage(model: Any, optimizer: Any) -> set[int]:
    """Storage addresses of the tensors only ``optimizer.step`` changes: parameters and
    optimizer state (buffers such as batch-norm statistics change in forward).
    ``optimizer`` is Fabric's wrapper (its ``.optimizer`` the torch one)."""
    tensors = list(model.parameters())
    for per_param in optimizer.optimizer.state.values():
        tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


def writes_whole_state(strategy: Any) -> bool:
    """Whether ``strategy`` holds the whole state on rank 0 and writes it with Fabric's
    default ``torch.save`` checkpoint IO (single device, DDP): such a state can be
    written by a background thread. Sharded strategies (FSDP) and custom IO cannot."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy

    return isinstance(strategy, SingleDeviceStrategy | DDPStrategy) and (
        type(strategy.checkpoint_io) is TorchCheckpointIO
    )


def save_hf_config(model: Any, directory: Path) -> None:
    """A model carrying a Hugging Face config gets it saved beside its weights (in
    ``HF_CONFIG_DIR``), which is what ``baton export --format hf`` needs."""
    config = getattr(model, "config", None)
    if not hasattr(config, "save_pretrained"):
        return
    config = copy.deepcopy(config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory / HF_CONFIG_DIR)


def plain_state(strategy: Any, state: dict[str, Any], model: Any, optimizer: Any) -> dict[str, Any]:
    """``state`` as ``fabric.save`` would write it: the wrapped model's and optimizer's
    state dicts through the strategy, and the state dicts of other stateful objects
    (schedulers); plain values as they are."""
    plain = dict(state)
    plain["model"] = strategy.get_module_state_dict(model.module)
    plain["optimizer"] = strategy.get_optimizer_state(optimizer.optimizer)
    for key, value in state.items():
        if key not in ("model", "optimizer") and hasattr(value, "state_dict"):
            plain[key] = value.state_dict()
    return plain


def rng_state(device: torch.device) -> dict[str, Any]:
    """The random state a resume restores: torch's CPU generator, and CUDA's on a GPU."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def with_every_rank(own: dict[str, Any], world_size: int) -> dict[str, Any]:
    """``own`` (this rank's data position and random state) to save, and under several
    ranks ``"ranks"``: every rank's, gathered (a collective: every rank saves). With DDP,
    ``fabric.save`` writes rank 0's file alone, while ranks' random streams and data
    positions may differ (seeded per rank, a sampler per rank): each rank must get its
    own back (``own_rank_state``)."""
    if world_size == 1:
        return dict(own)
    import torch.distributed as dist

    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, host_copy(own))
    return {**own, "ranks": every}


def own_rank_state(remainder: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's part of what ``with_every_rank`` saved: its own entry of ``"ranks"``,
    else the top level (rank 0's: a checkpoint of one process, one written before
    ``"ranks"`` existed, or one from a different number of ranks)."""
    ranks: list[dict[str, Any]] | None = remainder.get("ranks")
    if ranks is not None and len(ranks) == world_size:
        return ranks[rank]
    return remainder
