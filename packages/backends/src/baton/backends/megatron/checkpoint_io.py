"""The Megatron-Core backend's checkpoint I/O: ``dist_checkpointing`` saves (synchronous,
or asynchronous through ``checkpoint.AsyncSaves``), loads onto this run's layout, the
facts core records in ``baton.json`` and whether a saved layout reshards here. The step
engine (``MegatronBackend``) owns the model chunks, optimizer, schedule and data
streams; this reads and restores them.

Example::

    io = MegatronCheckpointIO(backend)      # the backend builds it in __init__
    handle = io.save(directory, asynchronous=True)
    io.wait_for_staging()                   # before the optimizer step
    io.load(directory)
    io.close()                              # at teardown: finish the writes
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from baton.backends.megatron.cpu import device_mode_paused
from baton.backends.megatron.data import data_fingerprint
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend


class MegatronCheckpointIO:
    """Checkpoints of one ``MegatronBackend``'s training state.

    Staging for asynchronous saves stays in Megatron's calls queue
    (``checkpoint.AsyncSaves``, ``thread_writer.ThreadCallsQueue``) rather than
    ``async_save.BackgroundSaves``: ``dist_checkpointing`` plans the write and runs its
    finalize functions on every rank through that queue.
    """

    def __init__(self, engine: MegatronBackend) -> None:
        self.engine = engine
        self._async_saves = AsyncSaves()

    # -- what core records --------------------------------------------------------------
    def facts(self) -> CheckpointFacts:
        """The layout, the global samples the data stream consumed and the data's
        fingerprint (``data.data_fingerprint``)."""
        engine = self.engine
        assert engine.train_stream is not None, "setup() must run first"
        fingerprint = data_fingerprint(engine.config.data, engine.source)
        return CheckpointFacts(engine.layout(), engine.train_stream.consumed, fingerprint)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """How ``dist_checkpointing`` reshards ``saved`` onto this layout, or why it
        cannot (``checkpoint.load_plan``): the RNG states stay fresh where the
        model-parallel shards differ."""
        return load_plan(saved, self.engine.layout())

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
            return self._async_saves.start(self._sharded_state(loading=False), directory)

    def wait_for_staging(self) -> None:
        """Block while a save still copies what the optimizer step changes (CPU writer)."""
        self._async_saves.wait_for_staging()

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore model, optimizer, scheduler, data position and RNG from ``directory``
        (the RNG left fresh where ``plan`` says).

        A failure is re-raised as ``CheckpointLoadError`` naming the Megatron call that
        failed and its message (or, for a bare assertion, the failing source line).
        """
        from megatron.core import dist_checkpointing

        engine = self.engine
        assert engine.train_stream is not None, "setup() must run before load()"
        with naming_failures("building the sharded state dict to load into"):
            init_optimizer_state(engine.optimizer)
            request = self._sharded_state(loading=True, rng="rng" not in plan.fresh)
        with naming_failures(f"dist_checkpointing.load({directory})"):
            state = dist_checkpointing.load(request, str(directory))
        # copying into the optimizer's fp32 shards (views of parameters) is not autograd work
        with naming_failures("restoring the loaded state"), torch.no_grad():
            load_model_state(engine.chunks, state["model"])
            engine.optimizer.load_state_dict(state["optimizer"])
            restore_optimizer_steps(engine.optimizer, state["optimizer"])
            engine.scheduler.load_state_dict(state["scheduler"])
            for stream in engine.train_streams:
                stream.load_state_dict(state["data"])
            if "rng" in state:
                set_rng_state(state["rng"])

    def _sharded_state(self, *, loading: bool, rng: bool = True) -> dict[str, Any]:
        from megatron.core import parallel_state
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        engine = self.engine
        assert engine.train_stream is not None
        model_state = model_sharded_state(engine.chunks)
        metadata = None
        if engine.config.ddp.use_distributed_optimizer:
            metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
        optimizer_state = engine.optimizer.sharded_state_dict(
            model_state, is_loading=loading, metadata=metadata
        )
        state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": engine.scheduler.state_dict(),
            "data": engine.train_stream.state_dict(),
        }
        if rng:
            tp, pp = engine.config.parallel_sizes()
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

    def close(self) -> None:
        """Finish the writes in flight (at teardown)."""
        self._async_saves.close()
