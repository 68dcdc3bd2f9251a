"""The LightningModule backend's checkpoint I/O: a Fabric checkpoint (``FabricCheckpointIO``)
that also holds every optimizer and scheduler ``configure_optimizers`` returned, the
module's and datamodule's checkpoint hooks' values and the loop's position.

Example::

    io = LightningCheckpointIO(backend)     # the backend builds it in __init__
    io.save(directory)                      # on_save_checkpoint runs, loop state saved
    io.load(directory)                      # on_load_checkpoint runs, loop state back
    holds_loop_state(directory)             # True: a LightningModule run's checkpoint
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.backends.dcp_safety import load_weights_only
from baton.backends.fabric.checkpoint import FabricCheckpointIO
from baton.backends.fabric.weights import STATE_FILE

if TYPE_CHECKING:
    from baton.backends.lightning.backend import LightningBackend

#: the backend name this backend's checkpoints recorded before it had its own
FORMER_NAME = "fabric"
#: the state entry of the LightningModule loop (``LightningLoop.state_dict``)
LOOP_STATE = "lightning_loop"
#: where a sharded (FSDP) Fabric checkpoint keeps its plain values, beside the shards
SHARDED_VALUES_FILE = "meta.pt"


class LightningCheckpointIO(FabricCheckpointIO):
    """Checkpoints of one ``LightningBackend``'s module, optimizers, schedulers and loop."""

    engine: LightningBackend

    def __init__(self, engine: LightningBackend) -> None:
        super().__init__(engine)

    def state(self) -> dict[str, Any]:
        """The wrapped module, every optimizer and every scheduler, restored in place."""
        loop = self.engine.loop
        state: dict[str, Any] = {"model": self.engine.model}
        for i, optimizer in enumerate(loop.optimizers):
            state["optimizer" if i == 0 else f"optimizer_{i}"] = optimizer
        for i, config in enumerate(loop.scheduler_configs):
            state[f"scheduler_{i}"] = config.scheduler
        return state

    def values(self) -> dict[str, Any]:
        """Fabric's values, the epoch, the datamodule's state and what the module's
        ``on_save_checkpoint`` adds (``"lightning"``), and the loop's position."""
        engine = self.engine
        values = super().values()
        assert engine.stream is not None
        checkpoint: dict[str, Any] = {"epoch": engine.stream.epoch}
        if engine.datamodule is not None:
            checkpoint[type(engine.datamodule).__qualname__] = engine.datamodule.state_dict()
        engine.module.on_save_checkpoint(checkpoint)
        values["lightning"] = checkpoint
        values[LOOP_STATE] = engine.loop.state_dict()
        return values

    def restore_values(self, remainder: dict[str, Any]) -> None:
        """Fabric's values, then the datamodule's state, ``on_load_checkpoint`` and the
        loop's position."""
        super().restore_values(remainder)
        engine = self.engine
        checkpoint = remainder.get("lightning", {})
        if engine.datamodule is not None:
            key = type(engine.datamodule).__qualname__
            if key in checkpoint:
                engine.datamodule.load_state_dict(checkpoint[key])
        engine.module.on_load_checkpoint(checkpoint)
        if LOOP_STATE in remainder:
            engine.loop.load_state_dict(remainder[LOOP_STATE])


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
