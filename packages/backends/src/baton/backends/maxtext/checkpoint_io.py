"""The MaxText backend's checkpoint I/O: save (synchronous, orbax's asynchronous save or
the whole save on a writer thread), load, the facts core records in ``baton.json`` and
whether a saved layout loads here. The step engine (``MaxTextBackend``) owns the state,
its data and its compiled steps; this reads and restores them.

Example::

    io = MaxTextCheckpointIO(backend)       # the backend builds it in __init__
    handle = io.save(directory, asynchronous=True)
    io.load(directory)                      # state, data position, onto this layout
    io.close()                              # at teardown: the writer thread stops
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.backends.async_save import BackgroundSaves, FuturePendingSave
from baton.backends.maxtext.background_save import frozen_iterator, whole_save_on_thread
from baton.backends.maxtext.checkpoint import (
    DATA_FILE,
    STATE_DIR,
    CheckpointerPendingSave,
    baton_step_of_maxtext_checkpoint,
    layout_refusal,
    maxtext_checkpoint_name,
    open_checkpointer,
    read_legacy_meta,
    restore_state,
    saved_name,
)
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan

if TYPE_CHECKING:
    from baton.backends.maxtext.backend import MaxTextBackend


#: the learning-rate factor and weight decay callbacks set (``model_state``), when any
HYPERPARAMETERS_FILE = "hyperparameters.json"


class MaxTextCheckpointIO:
    """Checkpoints of one ``MaxTextBackend``'s training state.

    The asynchronous save runs MaxText's whole ``save_checkpoint`` on the one writer
    thread of ``async_save.BackgroundSaves`` where it can (``whole_save_on_thread``: on
    CPU, one process); the engine's next step then keeps the arrays being written
    (``keep_state_next_step``). Elsewhere orbax's own asynchronous checkpointer stages
    and writes, as MaxText's loop does: its staging to host memory is orbax's.
    """

    def __init__(self, engine: MaxTextBackend) -> None:
        self.engine = engine
        self._background = BackgroundSaves()

    # -- save -------------------------------------------------------------------------
    def save(
        self, directory: Path, *, asynchronous: bool = False
    ) -> CheckpointerPendingSave | FuturePendingSave | None:
        """MaxText's ``save_checkpoint`` of the state (and its data iterator) into
        ``directory/checkpoint``, and baton's data position into ``data.json``."""
        import jax
        from maxtext.common import checkpointing

        engine = self.engine
        directory = Path(directory).resolve()  # orbax wants absolute paths
        name = max(maxtext_checkpoint_name(engine.optimizer_step()), 0)  # before any update: 0
        if jax.process_index() == 0:
            (directory / DATA_FILE).write_text(json.dumps(self._data_state()))
            hyperparameters = engine.hyperparameters_set()
            if hyperparameters:  # a learning-rate factor or weight decay a callback set
                (directory / HYPERPARAMETERS_FILE).write_text(json.dumps(hyperparameters))
        if asynchronous and whole_save_on_thread(
            engine.device_type, engine.hparams, engine.data_iterator
        ):
            return self._save_in_background(directory / STATE_DIR, name)
        checkpointer = open_checkpointer(engine.hparams, directory / STATE_DIR, asynchronous)
        checkpointing.save_checkpoint(
            checkpointer, name, engine.state, engine.hparams, engine.data_iterator, force=True
        )
        if asynchronous:
            return CheckpointerPendingSave(checkpointer)
        checkpointer.close()
        return None

    def _data_state(self) -> dict[str, Any]:
        engine = self.engine
        if engine.batches is not None:
            return engine.batches.state_dict()
        return {"pipeline": engine.dataset_type, "consumed": engine.consumed}

    def _save_in_background(self, root: Path, name: int) -> FuturePendingSave:
        """MaxText's ``save_checkpoint`` of this step's state on the writer thread; the
        next train step leaves these arrays valid (it does not donate them)."""
        from maxtext.common import checkpointing

        state, hparams = self.engine.state, self.engine.hparams
        iterator = frozen_iterator(
            self.engine.data_iterator, int(hparams.expansion_factor_real_data)
        )
        self.engine.keep_state_next_step()

        def write() -> None:
            checkpointer = open_checkpointer(hparams, root, asynchronous=False)
            try:
                checkpointing.save_checkpoint(
                    checkpointer, name, state, hparams, iterator, force=True
                )
            finally:
                checkpointer.close()

        return self._background.submit(write)

    def close(self) -> None:
        """Stop the writer thread (the driver waited for the saves)."""
        self._background.close()

    # -- what core records --------------------------------------------------------------
    def facts(self) -> CheckpointFacts:
        """The layout, the samples of the global batches drawn and the data's fingerprint."""
        engine = self.engine
        samples = engine.consumed * int(engine.hparams.global_batch_size_to_train_on)
        return CheckpointFacts(engine.layout(), samples, engine.data_fingerprint)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """Orbax reshards onto another mesh; ``scan_layers`` and Grain's per-process
        iterator states do not move (``checkpoint.layout_refusal``)."""
        return LoadPlan(refusal=layout_refusal(saved, self.engine.layout(), self.engine.hparams))

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """The facts ``baton_maxtext.json`` held before ``baton.json`` recorded them."""
        meta = read_legacy_meta(Path(directory).resolve())
        if meta is None:
            return None
        per_step = int(self.engine.hparams.global_batch_size_to_train_on)
        samples = int(meta["data"].get("consumed", 0)) * per_step
        return CheckpointFacts(meta.get("layout", {}), samples, meta.get("data_fingerprint", ""))

    # -- load -------------------------------------------------------------------------
    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore a checkpoint written by ``save`` (or in the older form with
        ``baton_maxtext.json``): state, data position, onto this layout."""
        directory = Path(directory).resolve()
        legacy = read_legacy_meta(directory)
        name = saved_name(directory)
        updates = self._restore(directory / STATE_DIR, name)
        expected = baton_step_of_maxtext_checkpoint(name)
        if updates != expected and (name, updates) != (0, 0):  # 0: saved before any update
            raise ValueError(
                f"{directory}: restored optimizer step {updates} differs from the one its "
                f"name records ({expected}); the checkpoint is inconsistent"
            )
        data_file = directory / DATA_FILE
        data = legacy["data"] if legacy is not None else json.loads(data_file.read_text())
        self._restore_data_position(data)
        if (directory / HYPERPARAMETERS_FILE).is_file():
            engine = self.engine
            engine.restore_hyperparameters_set(
                json.loads((directory / HYPERPARAMETERS_FILE).read_text())
            )

    def restore_maxtext_checkpoint(self, step_dir: str | Path) -> int:
        """Load a checkpoint MaxText's own loop wrote (``<checkpoint_dir>/<name>``).

        Returns the baton step to continue from (``name + 1`` optimizer updates); the
        data stream moves to the same point (one global batch per step; a Grain
        iterator from its saved state).
        """
        engine = self.engine
        step_dir = Path(step_dir).resolve()
        if not step_dir.name.isdigit():
            raise ValueError(f"{step_dir} is not a MaxText checkpoint step directory (<dir>/<n>)")
        updates = self._restore(step_dir.parent, int(step_dir.name))
        if updates != baton_step_of_maxtext_checkpoint(int(step_dir.name)):
            raise ValueError(
                f"{step_dir}: MaxText checkpoint {step_dir.name} holds optimizer step {updates}, "
                f"expected {baton_step_of_maxtext_checkpoint(int(step_dir.name))}"
            )
        if engine.batches is not None:
            engine.batches.skip_to(updates)
        elif engine.dataset_type != "grain":
            self._restore_data_position({"pipeline": engine.dataset_type, "consumed": updates})
        engine.consumed = updates
        return updates

    def _restore(self, root: Path, name: int) -> int:
        """Step ``name`` under ``root`` onto the live state; returns the optimizer step."""
        engine = self.engine
        restore_state(engine.hparams, engine.state, engine.data_iterator, root, name)
        return engine.optimizer_step()

    def _restore_data_position(self, data: Mapping[str, Any]) -> None:
        engine = self.engine
        if engine.batches is not None:
            if "consumed" in data and "seed" not in data:
                raise ValueError(
                    "the checkpoint was written by MaxText's own data pipeline; "
                    "resume with the same data_path and tokenizer"
                )
            engine.batches.load_state_dict(dict(data))
            engine.consumed = engine.batches.consumed
            return
        if data.get("pipeline") != engine.dataset_type:
            raise ValueError(
                f"the checkpoint's data came from {data.get('pipeline', 'baton bytes')!r}, this "
                f"run reads {engine.dataset_type!r}; resume with the same data settings"
            )
        consumed = int(data["consumed"])
        if engine.dataset_type != "grain":
            # MaxText checkpoints no Hugging Face iterator state: replay the stream's position
            for _ in range(consumed):
                next(engine.data_iterator)
        engine.consumed = consumed
