"""The Megatron-Core backend's checkpoint I/O: ``dist_checkpointing`` saves (synchronous,
or asynchronous through ``checkpoint.AsyncSaves``), loads onto this run's layout, the
facts core records in ``baton.json`` and whether a saved layout reshards here.

The step engine builds the model chunks, optimizer, schedule and data streams; its
``setup`` hands them to this I/O in a ``TrainingParts`` record, with the run's layout
and what the data's fingerprint is taken from. The I/O reads and restores them; it
never sees the engine.

Example (what ``MegatronBackend.setup`` does, then the loop)::

    saves = AsyncSaves()                    # the engine's, for the process's lifetime
    parts = TrainingParts(
        chunks, optimizer, scheduler, train_streams,
        layout={"tensor": 1, "pipeline": 1, ...}, data=config.data, source=source,
    )
    io = MegatronCheckpointIO(parts, saves)
    handle = io.save(directory, asynchronous=True)
    saves.wait_for_staging()                # before the optimizer step
    io.load(directory, io.plan_load(saved_layout))
    saves.close()                           # at teardown: finish the writes
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from baton.backends.megatron.checkpoint import (
    AsyncSaves,
    MegatronSave,
    init_optimizer_state,
    load_model_state,
    load_plan,
    model_sharded_state,
    naming_failures,
    restore_optimizer_steps,
    rng_state,
    set_rng_state,
)
from baton.backends.megatron.config import DataConfig
from baton.backends.megatron.cpu import device_mode_paused
from baton.backends.megatron.data import PreparedSource, TrainStream, data_fingerprint
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan


@dataclass(frozen=True)
class TrainingParts:
    """What one set-up Megatron-Core run checkpoints, and the facts recorded beside it.

    Args:
        chunks: this rank's DDP-wrapped ``GPTModel`` chunks (several with a virtual
            pipeline).
        optimizer: Megatron's optimizer over them (``get_megatron_optimizer``).
        scheduler: its ``OptimizerParamScheduler``.
        train_streams: one stream per chunk (``data.TrainStream``); the first one's
            position is saved and every one is restored to it.
        layout: the run's parallel layout (``MegatronBackend.layout()``: ``tensor``,
            ``pipeline``, ``distributed_optimizer``, ...), recorded in every checkpoint.
        data: the configured data, and ``source``: the prepared datasets (``None``: the
            byte corpus); the data's fingerprint is taken from them at each save.
    """

    chunks: list[Any]
    optimizer: Any
    scheduler: Any
    train_streams: list[TrainStream]
    layout: Mapping[str, Any]
    data: DataConfig
    source: PreparedSource | None

    @property
    def train_stream(self) -> TrainStream:
        """The stream whose position a checkpoint records."""
        return self.train_streams[0]


class MegatronCheckpointIO:
    """Checkpoints of one Megatron-Core run's training state (``TrainingParts``).

    Staging for asynchronous saves stays in Megatron's calls queue
    (``checkpoint.AsyncSaves``, ``thread_writer.ThreadCallsQueue``) rather than
    ``async_save.BackgroundSaves``: ``dist_checkpointing`` plans the write and runs its
    finalize functions on every rank through that queue. The queue lives as long as the
    engine (it waits on it before each optimizer step and closes it at teardown) and is
    handed here as ``saves``.
    """

    def __init__(self, parts: TrainingParts, saves: AsyncSaves) -> None:
        self.parts = parts
        self._saves = saves

    # -- what core records --------------------------------------------------------------
    def facts(self) -> CheckpointFacts:
        """The layout, the global samples the data stream consumed and the data's
        fingerprint (``data.data_fingerprint``)."""
        parts = self.parts
        fingerprint = data_fingerprint(parts.data, parts.source)
        return CheckpointFacts(dict(parts.layout), parts.train_stream.consumed, fingerprint)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """How ``dist_checkpointing`` reshards ``saved`` onto this layout, or why it
        cannot (``checkpoint.load_plan``): the RNG states stay fresh where the
        model-parallel shards differ."""
        return load_plan(saved, self.parts.layout)

    @staticmethod
    def legacy_facts(directory: Path) -> CheckpointFacts | None:
        """The layout older checkpoints kept in ``dist_checkpointing``'s common state."""
        from megatron.core import dist_checkpointing

        with naming_failures(f"dist_checkpointing.load_common_state_dict({directory})"):
            common = dist_checkpointing.load_common_state_dict(str(directory))
        layout = common.get("layout")
        data = common.get("data") or {}
        return None if layout is None else CheckpointFacts(layout, int(data.get("consumed", 0)))

    # -- save and load ------------------------------------------------------------------
    def save(self, directory: Path, *, asynchronous: bool = False) -> MegatronSave | None:
        from megatron.core import dist_checkpointing

        if not asynchronous:
            dist_checkpointing.save(self._sharded_state(loading=False), str(directory))
            return None
        # what blocks the loop: the state's description and the save plan (the write
        # and its staging copy run in the background); no CUDA call, so without the
        # per-call cost of the CPU device mode
        with device_mode_paused():
            return self._saves.start(self._sharded_state(loading=False), directory)

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore model, optimizer, scheduler, data position and RNG from ``directory``
        (the RNG left fresh where ``plan`` says).

        A failure is re-raised as ``CheckpointLoadError`` naming the Megatron call that
        failed and its message (or, for a bare assertion, the failing source line).
        """
        from megatron.core import dist_checkpointing

        parts = self.parts
        with naming_failures("building the sharded state dict to load into"):
            init_optimizer_state(parts.optimizer)
            request = self._sharded_state(loading=True, rng="rng" not in plan.fresh)
        with naming_failures(f"dist_checkpointing.load({directory})"):
            state = dist_checkpointing.load(request, str(directory))
        # copying into the optimizer's fp32 shards (views of parameters) is not autograd work
        with naming_failures("restoring the loaded state"), torch.no_grad():
            load_model_state(parts.chunks, state["model"])
            parts.optimizer.load_state_dict(state["optimizer"])
            restore_optimizer_steps(parts.optimizer, state["optimizer"])
            parts.scheduler.load_state_dict(state["scheduler"])
            for stream in parts.train_streams:
                stream.load_state_dict(state["data"])
            if "rng" in state:
                set_rng_state(state["rng"])

    def _sharded_state(self, *, loading: bool, rng: bool = True) -> dict[str, Any]:
        from megatron.core import parallel_state
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        parts = self.parts
        model_state = model_sharded_state(parts.chunks)
        metadata = None
        if parts.layout["distributed_optimizer"]:
            metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
        optimizer_state = parts.optimizer.sharded_state_dict(
            model_state, is_loading=loading, metadata=metadata
        )
        state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": parts.scheduler.state_dict(),
            "data": parts.train_stream.state_dict(),
        }
        if rng:
            tp, pp = parts.layout["tensor"], parts.layout["pipeline"]
            state["rng"] = ShardedObject(
                "rng_state",
                rng_state(),
                (pp, tp),
                (
                    parallel_state.get_pipeline_model_parallel_rank(),
                    parallel_state.get_tensor_model_parallel_rank(),
                ),
                replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True),
            )
        return state
