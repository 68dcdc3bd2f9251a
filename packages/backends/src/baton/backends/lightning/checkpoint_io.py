"""What a LightningModule run's checkpoint holds beside a Fabric run's: every optimizer
and scheduler ``configure_optimizers`` returned (``lightning_state``), and the epoch,
the datamodule's state, what the module's ``on_save_checkpoint`` adds and the loop's
position (``LightningCheckpointValues``). The backend's ``FabricCheckpointIO`` is handed
both; ``holds_loop_state`` tells such a checkpoint from a plain Fabric run's.

Example::

    io = FabricCheckpointIO(runtime, lambda: backend.parts, backend.position,
                            names=lightning_state,
                            extras=LightningCheckpointValues(loop, module, datamodule))
    io.save(directory)                      # on_save_checkpoint runs, loop state saved
    io.load(directory)                      # on_load_checkpoint runs, loop state back
    holds_loop_state(directory)             # True: a LightningModule run's checkpoint
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baton.backends.dcp_safety import load_weights_only
from baton.backends.fabric.runtime import TrainingParts
from baton.backends.fabric.weights import STATE_FILE
from baton.backends.lightning.loop import LightningLoop

#: the backend name this backend's checkpoints recorded before it had its own
FORMER_NAME = "fabric"
#: the state entry of the LightningModule loop (``LightningLoop.state_dict``)
LOOP_STATE = "lightning_loop"
#: where a sharded (FSDP) Fabric checkpoint keeps its plain values, beside the shards
SHARDED_VALUES_FILE = "meta.pt"


def lightning_state(parts: TrainingParts) -> dict[str, Any]:
    """The live state under its checkpoint names: the wrapped module, every optimizer
    (``optimizer``, ``optimizer_1``, ...) and every scheduler (``scheduler_0``, ...),
    restored in place."""
    state: dict[str, Any] = {"model": parts.model}
    for i, optimizer in enumerate(parts.optimizers):
        state["optimizer" if i == 0 else f"optimizer_{i}"] = optimizer
    for i, scheduler in enumerate(parts.schedulers):
        state[f"scheduler_{i}"] = scheduler
    return state


class LightningCheckpointValues:
    """The values a LightningModule run saves after Fabric's (``CheckpointExtras``).

    Args:
        loop: the run's ``LightningLoop`` (its stream's epoch and its position).
        module: the LightningModule (``on_save_checkpoint`` / ``on_load_checkpoint``).
        datamodule: its LightningDataModule, if any (``state_dict`` / ``load_state_dict``).
    """

    def __init__(self, loop: LightningLoop, module: Any, datamodule: Any) -> None:
        self.loop, self.module, self.datamodule = loop, module, datamodule

    def values(self) -> dict[str, Any]:
        """The epoch, the datamodule's state and what the module's
        ``on_save_checkpoint`` adds (``"lightning"``), and the loop's position."""
        assert self.loop.stream is not None
        checkpoint: dict[str, Any] = {"epoch": self.loop.stream.epoch}
        if self.datamodule is not None:
            checkpoint[type(self.datamodule).__qualname__] = self.datamodule.state_dict()
        self.module.on_save_checkpoint(checkpoint)
        return {"lightning": checkpoint, LOOP_STATE: self.loop.state_dict()}

    def restore(self, remainder: dict[str, Any]) -> None:
        """The datamodule's state, ``on_load_checkpoint`` and the loop's position."""
        checkpoint = remainder.get("lightning", {})
        if self.datamodule is not None:
            key = type(self.datamodule).__qualname__
            if key in checkpoint:
                self.datamodule.load_state_dict(checkpoint[key])
        self.module.on_load_checkpoint(checkpoint)
        if LOOP_STATE in remainder:
            self.loop.load_state_dict(remainder[LOOP_STATE])


def holds_loop_state(directory: Path) -> bool:
    """Whether the Fabric checkpoint in ``directory`` (a checkpoint's ``backend/``) holds
    the LightningModule loop's state: a plain Fabric run's never does. Tensors are
    memory-mapped, not read; the checkpoint is unpickled weights-only, as ``load`` does
    (a file naming anything but checkpoint data is refused: ``UnsafeCheckpointError``)."""
    file = Path(directory) / STATE_FILE
    if file.is_dir():
        file = file / SHARDED_VALUES_FILE
    if not file.is_file():
        return False
    state = load_weights_only(file, mmap=True)
    return isinstance(state, dict) and LOOP_STATE in state
