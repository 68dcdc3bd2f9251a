"""The TorchTitan backend's checkpoint I/O: DCP saves through TorchTitan's
``CheckpointManager`` (synchronous or asynchronous), loads onto this run's layout through
DCP's resharding, the facts core records in ``baton.json`` and whether a saved layout
loads here. It is handed TorchTitan's ``Trainer`` (its ``checkpointer``, ``parallel_dims``,
``config.training`` and ``step``) and the run's ``reshard_data`` choice; the backend
builds it in ``setup``, once the ``Trainer`` exists.

Example::

    io = TitanCheckpointIO(trainer, reshard_data="refuse")
    handle = io.save(directory, asynchronous=True)
    plan = io.plan_load(saved_layout)        # core asks before load; refusal: cannot
    io.load(directory, plan)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from baton.backends.async_save import FuturePendingSave
from baton.backends.torchtitan.optimizer_state import optimizer_state_held, saved_keys
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan

logger = logging.getLogger(__name__)

#: what ``load`` does when the data-parallel degree changed: TorchTitan's data loader
#: state is per data-parallel rank and does not reshard
RESHARD_DATA = ("refuse", "restart")
#: the side file checkpoints held before ``baton.json`` recorded their layout (read only)
LEGACY_LAYOUT_FILE = "layout.json"
#: the parallel degrees a layout is made of, as ``ParallelDims`` names them
LAYOUT_KEYS = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


class DcpSave(FuturePendingSave):
    """An asynchronous DCP save in flight through TorchTitan's ``CheckpointManager``:
    its future, and the manager's own wait (staging, the writer process) on ``wait``."""

    def __init__(self, future: Future[Any], checkpointer: Any) -> None:
        super().__init__(future)
        self.checkpointer = checkpointer

    def _join(self) -> None:
        self.checkpointer.maybe_wait_for_saving()
        super()._join()


def stage_without_accelerator(checkpointer: Any) -> None:
    """``async_with_pinned_mem`` on a machine with no accelerator.

    TorchTitan's stager copies with pinned memory and non-blocking copies, which DCP
    refuses without an accelerator. Given a stager of the same kind (staging on its
    own thread, into shared memory for the writer process) minus those two, the copy
    overlaps the next step's forward and backward exactly as on a GPU: TorchTitan's
    ``train_step`` waits for it before the optimizer changes the weights. Its copies
    release the interpreter lock (``cpu_staging``), so the loop is not held up.
    """
    from baton.backends.torchtitan.cpu_staging import cpu_stager

    if torch.accelerator.is_available() or getattr(checkpointer, "stager", 0) is not None:
        return
    checkpointer.stager = cpu_stager(shared_memory=True)


class TitanCheckpointIO:
    """Checkpoints of one TorchTitan ``Trainer`` (weights, optimizer, schedule, data loader
    and step), through its ``CheckpointManager``; ``reshard_data`` (one of
    ``RESHARD_DATA``) says what a load onto another data-parallel degree does."""

    def __init__(self, trainer: Any, *, reshard_data: str = "refuse") -> None:
        if reshard_data not in RESHARD_DATA:
            raise ValueError(f"reshard_data={reshard_data!r}: use one of {RESHARD_DATA}")
        self.trainer = trainer
        self.reshard_data = reshard_data

    def layout(self) -> dict[str, int]:
        """This run's parallel layout as TorchTitan resolved it (``ep`` where experts
        are sharded), and its world size."""
        dims = self.trainer.parallel_dims
        facts = {key: int(getattr(dims, key)) for key in LAYOUT_KEYS}
        if dims.ep > 1:  # expert parallelism (recorded where used)
            facts["ep"] = int(dims.ep)
        return {**facts, "world_size": int(dims.world_size)}

    def facts(self) -> CheckpointFacts:
        """The layout, and the samples of the optimizer steps taken (TorchTitan's data
        loader keeps its own position; the data has no fingerprint here)."""
        dims = self.trainer.parallel_dims
        training = self.trainer.config.training
        per_step = int(getattr(training, "global_batch_size", -1) or -1)
        if per_step <= 0:
            per_step = int(training.local_batch_size) * int(dims.dp_replicate * dims.dp_shard)
        return CheckpointFacts(self.layout(), samples=int(self.trainer.step) * per_step)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """DCP reshards weights, optimizer and schedule onto any layout; TorchTitan's
        data-loader position is per data-parallel rank and moves only while
        ``dp_replicate x dp_shard`` stays. Otherwise ``reshard_data="refuse"`` (the
        default) refuses, and ``"restart"`` plans a load that leaves the data loader at
        the beginning of its data. A run on rollouts keeps no data position per rank
        (the rollout phase's state is the same on every rank): any degree loads."""
        from baton.backends.torchtitan.rollout_rows import RolloutDataLoader

        now = self.layout()
        before = int(saved.get("dp_replicate", 1)) * int(saved.get("dp_shard", 1))
        after = now["dp_replicate"] * now["dp_shard"]
        if before == after or isinstance(self.trainer.dataloader, RolloutDataLoader):
            logger.info("resharding checkpoint from %s to %s", dict(saved), now)
            return LOAD_ALL
        if self.reshard_data == "refuse":
            return LoadPlan(
                refusal="DCP reshards weights, optimizer and schedule, but TorchTitan's "
                "data-loader position is per data-parallel rank and cannot move from "
                f"{before} to {after} data-parallel ranks: keep dp_replicate x dp_shard = "
                f"{before}, or pass TorchTitanBackend(..., reshard_data='restart') to "
                "restart the data from its beginning"
            )
        return LoadPlan(
            fresh=frozenset({"data"}),
            note=f"resharding checkpoint from {dict(saved)} to {now}; the data loader "
            "restarts from the beginning of its data (reshard_data='restart')",
        )

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """``layout.json``, written beside the DCP state before ``baton.json`` recorded it."""
        file = Path(directory) / LEGACY_LAYOUT_FILE
        return CheckpointFacts(json.loads(file.read_text())) if file.is_file() else None

    def save(self, directory: Path, *, asynchronous: bool = False) -> DcpSave | None:
        """Write TorchTitan's full training state (DCP) under ``directory/step-N``."""
        checkpointer = self.trainer.checkpointer
        checkpointer.maybe_wait_for_saving()
        checkpointer.folder = str(directory)
        checkpointer.save(curr_step=self.trainer.step, last_step=False)
        future = checkpointer.save_future
        if future is None:
            return None
        if asynchronous:
            return DcpSave(future, checkpointer)
        checkpointer.maybe_wait_for_saving()
        return None

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore model, optimizer, scheduler, data loader and step from ``save``'s output.

        A checkpoint saved on another layout (FSDP 2 -> TP 2, 2 ranks -> 1...) loads through
        DCP's resharding, as ``plan_load`` planned it (the data loader left out where the
        plan keeps the data fresh: ``reshard_data="restart"``). The optimizers' state
        comes back for the parameters it was saved for (``optimizer_state.py``: none for
        those frozen since the first step).
        """
        checkpointer = self.trainer.checkpointer
        checkpointer.folder = str(directory)
        step = checkpointer._find_load_step()
        if step < 0:
            raise FileNotFoundError(f"no TorchTitan checkpoint (step-N folder) in {directory}")
        excluded = list(checkpointer.exclude_from_loading)
        if "data" in plan.fresh and "dataloader" not in excluded:
            checkpointer.exclude_from_loading = [*excluded, "dataloader"]
        # parameters frozen since the first step have no optimizer state saved
        held = saved_keys(Path(directory) / f"step-{step}")
        try:
            with optimizer_state_held(checkpointer, held):
                checkpointer.load(step=step)
        finally:
            checkpointer.exclude_from_loading = excluded
