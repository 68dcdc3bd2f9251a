"""The Fabric backend's checkpoint I/O (``FabricCheckpointIO``) and the host copies
of its asynchronous save.

Everything a save writes is copied to host memory when the save starts, except the
tensors only the optimizer step changes (parameters, optimizer state): those are left
as ``DeferredCopy`` and copied on the writer thread while the next step's forward and
backward run; the optimizer step waits until that copy is taken (a pre-step hook on
the optimizer and a ``StagingGate``). Code that writes the weights outside the
optimizer step right after an asynchronous save (a callback editing parameters)
calls ``FabricCheckpointIO.wait_for_staging()`` first.

Example::

    staged = host_copy(state, defer=step_owned_storage(model, optimizer))
    ...                          # on the writer thread
    torch.save(finish_host_copy(staged), path)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from baton.backends.async_save import BackgroundSaves, FuturePendingSave, StagingGate
from baton.backends.dcp_safety import weights_only_loading
from baton.backends.fabric.runtime import FabricRuntime, TrainingParts
from baton.backends.fabric.stream import DataPosition
from baton.backends.fabric.weights import HF_CONFIG_DIR, STATE_FILE
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan


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


class CheckpointExtras(Protocol):
    """Values a checkpoint holds beside the Fabric backend's own (a LightningModule
    run's: its hooks' values and the loop's position), saved after them and restored
    after them."""

    def values(self) -> dict[str, Any]: ...

    def restore(self, remainder: dict[str, Any]) -> None: ...


def fabric_state(parts: TrainingParts) -> dict[str, Any]:
    """The Fabric backend's live state under its checkpoint names: the model, the
    optimizer and, where there is one, the scheduler."""
    state: dict[str, Any] = {"model": parts.model, "optimizer": parts.optimizer}
    if parts.schedulers:
        state["scheduler"] = parts.schedulers[0]
    return state


class FabricCheckpointIO:
    """Checkpoints of one Fabric run: ``fabric.save``/``fabric.load`` of its live state
    (``state()``: the model, optimizers and schedulers, restored in place; ``values()``:
    each rank's data position, random state and samples consumed, then any
    ``extras``), asynchronous saves staged as this module describes, and the facts core
    records in ``baton.json``. The Fabric and LightningModule backends each own one.

    Args:
        runtime: the run's ``FabricRuntime`` (its Fabric, device and ranks once launched).
        parts: returns the run's ``TrainingParts`` (built in ``setup``; read when called).
        position: the run's ``DataPosition`` (stream and samples), saved and restored.
        names: the live state under its checkpoint names (``fabric_state``; a
            LightningModule run names every optimizer and scheduler).
        extras: more values saved after these and restored after them.

    Example::

        io = FabricCheckpointIO(runtime, lambda: backend.parts, backend.position)
        handle = io.save(directory, asynchronous=True)
        io.wait_for_staging()                    # before editing weights
        io.load(directory)
        io.close()

    Staging stays here rather than in ``async_save.BackgroundSaves`` alone: the copy
    must come out of the strategy's own state dicts (``plain_state``) and leave the
    tensors the optimizer step owns for the writer thread, which only this backend's
    optimizer hook can hold back.
    """

    def __init__(
        self,
        runtime: FabricRuntime,
        parts: Callable[[], TrainingParts | None],
        position: DataPosition,
        *,
        names: Callable[[TrainingParts], dict[str, Any]] = fabric_state,
        extras: CheckpointExtras | None = None,
    ) -> None:
        self.runtime = runtime
        self._parts = parts
        self.position = position
        self._names = names
        self.extras = extras
        self._saves = BackgroundSaves()
        #: holds the optimizer step while an asynchronous save copies the weights
        self._staging = StagingGate()
        self._staging_hook: Any = None

    @property
    def parts(self) -> TrainingParts:
        parts = self._parts()
        assert parts is not None, "checkpoints are saved and loaded after setup"
        return parts

    @property
    def asynchronous(self) -> bool:
        """Single-device and DDP states are whole on rank 0: a host copy is written by a
        thread with ``torch.save`` (the file Fabric's default checkpoint IO writes).
        Sharded strategies (FSDP) and custom checkpoint IO save synchronously."""
        return writes_whole_state(self.runtime.fabric.strategy)

    def save(self, directory: Path, *, asynchronous: bool = False) -> FuturePendingSave | None:
        """Write the run's state (``fabric.save``'s) as ``directory/STATE_FILE``; a
        handle when ``asynchronous`` and the strategy allows it."""
        fabric, parts = self.runtime.fabric, self.parts
        model, optimizer = parts.model, parts.optimizer
        state = {**self.state(), **self.values()}
        if fabric.global_rank == 0:
            save_hf_config(parts.raw_model, directory)
        self.wait_for_staging()  # an earlier save still copying the weights
        path = directory / STATE_FILE
        if not (asynchronous and self.asynchronous):
            fabric.save(path, state)
            return None
        state = plain_state(fabric.strategy, state, model, optimizer)
        staged = host_copy(state, defer=step_owned_storage(model, optimizer))
        if self._staging_hook is None:  # the next optimizer step waits for the copy
            self._staging_hook = optimizer.optimizer.register_step_pre_hook(
                lambda *_: self.wait_for_staging()
            )
        copying = self._staging.begin()
        write = fabric.strategy.is_global_zero

        def copy_then_write() -> None:
            with copying:  # the optimizer step may go on once the copy is taken
                snapshot = finish_host_copy(staged)
            if write:  # the file fabric.save writes through TorchCheckpointIO
                torch.save(snapshot, path)

        return self._saves.submit(copy_then_write)  # every rank hands back a handle alike

    def wait_for_staging(self) -> None:
        """Block until an asynchronous save has copied the weights and optimizer state."""
        self._staging.wait()

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """``fabric.load`` into the run's live state, then its plain values; unpickled
        weights-only under the checkpoint allow-list (``dcp_safety``): a file naming
        anything else is refused, nothing in it run."""
        self.wait_for_staging()
        path = directory / STATE_FILE
        with weights_only_loading(path):
            remainder = self.runtime.fabric.load(path, self.state(), weights_only=True)
        self.restore_values(remainder)

    def state(self) -> dict[str, Any]:
        """The live objects a checkpoint holds, restored in place by ``fabric.load``."""
        return self._names(self.parts)

    def values(self) -> dict[str, Any]:
        """Plain values saved beside the model: data position, random state, samples
        consumed, every rank's (``with_every_rank``: ``fabric.save`` writes rank 0's);
        then the ``extras``."""
        runtime, position = self.runtime, self.position
        assert position.stream is not None
        own = {
            "data": position.stream.state_dict(),
            "rng": rng_state(runtime.fabric.device),
            "samples": position.samples,
        }
        values = with_every_rank(own, runtime.fabric.world_size)
        if self.extras is not None:
            values.update(self.extras.values())
        return values

    def restore_values(self, remainder: dict[str, Any]) -> None:
        """Restore this rank's ``values()`` from what ``fabric.load`` left, then the
        ``extras``."""
        fabric, position = self.runtime.fabric, self.position
        assert position.stream is not None
        own = own_rank_state(remainder, fabric.global_rank, fabric.world_size)
        position.stream.load_state_dict(own["data"])
        position.samples = int(own.get("samples", 0))
        restore_rng_state(own["rng"], fabric.device)
        if self.extras is not None:
            self.extras.restore(remainder)

    def facts(self) -> CheckpointFacts:
        """The strategy's layout and the samples consumed (the data is the user's
        iterable: no fingerprint)."""
        fabric = self.runtime.fabric
        sharded = "sharded" if not writes_whole_state(fabric.strategy) else "whole"
        layout = {"strategy": type(fabric.strategy).__name__, "state": sharded}
        layout["world_size"] = int(fabric.world_size)
        return CheckpointFacts(layout, self.position.samples)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """A whole state loads on any number of ranks and strategies that take a whole
        state; a sharded one (FSDP) only on the strategy that wrote it."""
        current = self.facts().layout
        if saved.get("state") == current["state"] == "whole":
            return LOAD_ALL
        if saved.get("strategy") == current["strategy"]:
            return LOAD_ALL
        return LoadPlan(
            refusal=f"a {saved.get('state')} state saved by {saved.get('strategy')} does not "
            f"load into {current['strategy']}; resume with strategy {saved.get('strategy')!r}"
        )

    @staticmethod
    def legacy_facts(directory: Path) -> CheckpointFacts | None:
        """None: Fabric checkpoints never had a side file of facts."""
        return None

    def close(self) -> None:
        """Wait for a save still being written, stop the writer thread and release the
        optimizer (a next ``setup`` builds another)."""
        self._saves.close()
        if self._staging_hook is not None:
            self._staging_hook.remove()
            self._staging_hook = None
