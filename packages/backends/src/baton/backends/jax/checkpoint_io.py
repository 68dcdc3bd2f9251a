"""The JAX backend's checkpoint I/O: orbax (synchronous, or orbax's own asynchronous
save, which stages the arrays itself) for the train state, each process's data position
in ``data_rank<N>.json``, and the facts core records in ``baton.json``. The step engine
owns the train state, the data stream and the counters; this is handed them (the state
through a getter and a setter, as each step replaces it) and reads and restores them.

Example::

    slot = {"state": train_state}
    io = JaxCheckpointIO(                   # the backend builds it in setup
        read_state=lambda: slot["state"], write_state=lambda s: slot.update(state=s),
        data=stream, progress=TrainProgress(), controls=StepControls(), rank=0, processes=1,
    )
    handle = io.save(directory, asynchronous=True)
    io.load(directory)                      # slot["state"] is the restored state
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from baton.backends.async_save import FuturePendingSave
from baton.backends.jax.data import BatchStream
from baton.backends.jax.model_state import StepControls
from baton.backends.jax.progress import TrainProgress
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan

STATE_DIR = "state"
#: the side file checkpoints held before ``baton.json`` recorded their facts (read only)
LEGACY_META_FILE = "baton_jax.json"


def data_file(rank: int) -> str:
    """The file holding process ``rank``'s data position inside a checkpoint."""
    return f"data_rank{rank:05d}.json"


class JaxCheckpointIO:
    """Checkpoints of one JAX train state (a pytree with a ``step``) and data position.

    ``read_state``/``write_state`` get and replace the engine's current train state;
    ``data``, ``progress`` and ``controls`` (the lr scale a callback set) are the
    engine's own objects, restored in place; ``rank`` and ``processes`` are this JAX
    process's index and the process count.
    """

    def __init__(
        self,
        *,
        read_state: Callable[[], Any],
        write_state: Callable[[Any], None],
        data: BatchStream,
        progress: TrainProgress,
        controls: StepControls,
        rank: int,
        processes: int,
    ) -> None:
        self.read_state, self.write_state = read_state, write_state
        self.data, self.progress, self.controls = data, progress, controls
        self.rank, self.processes = rank, processes

    def save(self, directory: Path, *, asynchronous: bool = False) -> FuturePendingSave | None:
        """Orbax save of the train state into ``directory/state``, plus each process's
        data position (``data_rank00000.json`` ...)."""
        from orbax.checkpoint import v1 as ocp

        state = self.read_state()
        assert state is not None, "save after setup"
        directory = Path(directory).resolve()  # orbax wants absolute paths
        position = {
            "step": self.progress.steps_done,
            "samples": self.progress.samples_consumed,
            "data": self.data.state_dict(),
            "lr_scale": self.controls.lr_scale,  # a learning rate a callback set
        }
        (directory / data_file(self.rank)).write_text(json.dumps(position))
        if not asynchronous:
            ocp.save(directory / STATE_DIR, state)
            return None
        return FuturePendingSave(ocp.save_async(directory / STATE_DIR, state))

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore a checkpoint written by ``save``: the train state, then the data position."""
        import jax
        from orbax.checkpoint import v1 as ocp

        state = self.read_state()
        assert state is not None, "load after setup"
        directory = Path(directory).resolve()
        position_file = directory / data_file(self.rank)
        if not (directory / STATE_DIR).is_dir() or not position_file.is_file():
            found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
            raise FileNotFoundError(
                f"{directory} is not a JAX-backend checkpoint for process {self.rank} "
                f"(expected {STATE_DIR}/ and {data_file(self.rank)}; found {found}); a "
                "checkpoint resumes with as many processes as wrote it"
            )
        position = json.loads(position_file.read_text())
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        state = ocp.load(directory / STATE_DIR, abstract)
        self.write_state(state)
        restored_step = int(jax.device_get(state["step"]))
        if restored_step != position["step"]:
            raise ValueError(
                f"{directory}: the train state is at step {restored_step} but the data position "
                f"was recorded at step {position['step']}; the checkpoint is inconsistent"
            )
        self.progress.steps_done = restored_step
        self.progress.samples_consumed = int(position.get("samples", 0))
        self.data.load_state_dict(position["data"])
        controls = self.controls
        controls.lr_scale = float(position.get("lr_scale", 1.0))
        controls.scaled = controls.scaled or controls.lr_scale != 1.0
        controls.changed()

    def facts(self) -> CheckpointFacts:
        """The processes holding a data position each, and the samples drawn (the
        data is the user's iterator: no fingerprint)."""
        return CheckpointFacts({"processes": self.processes}, self.progress.samples_consumed)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """Everything loads on the number of processes that wrote it; on another, refused:
        each process keeps its own data position."""
        if saved.get("processes") == self.processes:
            return LOAD_ALL
        return LoadPlan(
            refusal="each process keeps its own data position (data_rank<N>.json), which "
            f"does not move to another number of processes; resume on "
            f"{saved.get('processes')} process(es)"
        )

    @staticmethod
    def legacy_facts(directory: Path) -> CheckpointFacts | None:
        """``baton_jax.json``, written beside the state before ``baton.json`` recorded it."""
        side = directory / LEGACY_META_FILE
        if not side.is_file():
            return None
        return CheckpointFacts({"processes": int(json.loads(side.read_text())["processes"])})
