"""The MaxText backend's checkpoint I/O: save (synchronous, orbax's asynchronous save or
the whole save on a writer thread), load, the facts core records in ``baton.json`` and
whether a saved layout loads here. The step engine owns the state, its data and its
compiled steps; this is handed them (the state through a getter: MaxText's restore
writes into it in place) and reads and restores them.

Example::

    io = MaxTextCheckpointIO(               # the backend builds it in setup
        state=lambda: engine.state, hparams=hparams, layout=layout, device_type="cpu",
        data=TrainingData("synthetic", batches, None, fingerprint),
        steps=train_steps, saves=BackgroundSaves(),
    )
    handle = io.save(directory, asynchronous=True)
    io.load(directory)                      # state, data position, onto this layout
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.backends.async_save import BackgroundSaves, FuturePendingSave
from baton.backends.maxtext.background_save import frozen_iterator, whole_save_on_thread
from baton.backends.maxtext.byte_stream import TextBatches
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
from baton.backends.maxtext.epoch_order import BATCHES_KEY
from baton.backends.maxtext.packed_batches import PackedBatches
from baton.backends.maxtext.rollout_batches import RolloutBatches
from baton.backends.maxtext.step_parts import optimizer_step
from baton.backends.maxtext.train_steps import TrainSteps
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan

#: the learning-rate factor and weight decay callbacks set (``model_state``), when any
HYPERPARAMETERS_FILE = "hyperparameters.json"


@dataclass
class TrainingData:
    """The training data of a MaxText run, as its checkpoints save and restore it."""

    #: MaxText's ``dataset_type`` as text: synthetic (baton's streams), grain or hf
    dataset_type: str
    #: baton's stream (bytes, prepared rows, or the rollout phase's rows), else ``None``
    batches: TextBatches | PackedBatches | RolloutBatches | None
    #: MaxText's own data iterator (Grain or Hugging Face pipeline), else ``None``
    iterator: Any
    #: a short hash of the training data (core refuses a resume on other data)
    fingerprint: str
    #: global batches taken from the stream since step 0 (saved as ``"consumed"``)
    batches_read: int = 0


class MaxTextCheckpointIO:
    """Checkpoints of one MaxText run's training state.

    The asynchronous save runs MaxText's whole ``save_checkpoint`` on the one writer
    thread of ``async_save.BackgroundSaves`` where it can (``whole_save_on_thread``: on
    CPU, one process); the engine's next step then keeps the arrays being written
    (``TrainSteps.keep_state_next_step``). Elsewhere orbax's own asynchronous
    checkpointer stages and writes, as MaxText's loop does: its staging to host memory
    is orbax's.

    Handed: ``state`` (a getter of the live train state), MaxText's resolved config
    ``hparams``, the run's ``layout`` (``checkpoint.layout_refusal`` compares it),
    ``device_type``, the ``data``, the run's ``steps`` (keeping the state for a
    background save; the hyperparameters callbacks set) and the writer thread ``saves``
    (whoever owns it closes it).
    """

    def __init__(
        self,
        *,
        state: Callable[[], Any],
        hparams: Any,
        layout: Mapping[str, Any],
        device_type: str,
        data: TrainingData,
        steps: TrainSteps,
        saves: BackgroundSaves,
    ) -> None:
        self._state = state
        self.hparams = hparams
        self.layout = dict(layout)
        self.device_type = device_type
        self.data = data
        self.steps = steps
        self._background = saves

    # -- save -------------------------------------------------------------------------
    def save(
        self, directory: Path, *, asynchronous: bool = False
    ) -> CheckpointerPendingSave | FuturePendingSave | None:
        """MaxText's ``save_checkpoint`` of the state (and its data iterator) into
        ``directory/checkpoint``, and baton's data position into ``data.json``."""
        import jax
        from maxtext.common import checkpointing

        state, hparams, data = self._state(), self.hparams, self.data
        directory = Path(directory).resolve()  # orbax wants absolute paths
        name = max(maxtext_checkpoint_name(optimizer_step(state)), 0)  # before any update: 0
        if jax.process_index() == 0:
            (directory / DATA_FILE).write_text(json.dumps(self._data_state()))
            hyperparameters = self.steps.hyperparameters_set()
            if hyperparameters:  # a learning-rate factor or weight decay a callback set
                (directory / HYPERPARAMETERS_FILE).write_text(json.dumps(hyperparameters))
        if asynchronous and whole_save_on_thread(self.device_type, hparams, data.iterator):
            return self._save_in_background(directory / STATE_DIR, name)
        checkpointer = open_checkpointer(hparams, directory / STATE_DIR, asynchronous)
        checkpointing.save_checkpoint(checkpointer, name, state, hparams, data.iterator, force=True)
        if asynchronous:
            return CheckpointerPendingSave(checkpointer)
        checkpointer.close()
        return None

    def _data_state(self) -> dict[str, Any]:
        data = self.data
        if data.batches is not None:
            return data.batches.state_dict()
        return {"pipeline": data.dataset_type, BATCHES_KEY: data.batches_read}

    def _save_in_background(self, root: Path, name: int) -> FuturePendingSave:
        """MaxText's ``save_checkpoint`` of this step's state on the writer thread; the
        next train step leaves these arrays valid (it does not donate them)."""
        from maxtext.common import checkpointing

        state, hparams = self._state(), self.hparams
        iterator = frozen_iterator(self.data.iterator, int(hparams.expansion_factor_real_data))
        self.steps.keep_state_next_step()

        def write() -> None:
            checkpointer = open_checkpointer(hparams, root, asynchronous=False)
            try:
                checkpointing.save_checkpoint(
                    checkpointer, name, state, hparams, iterator, force=True
                )
            finally:
                checkpointer.close()

        return self._background.submit(write)

    # -- what core records --------------------------------------------------------------
    def facts(self) -> CheckpointFacts:
        """The layout, the samples of the global batches drawn and the data's fingerprint."""
        samples = self.data.batches_read * int(self.hparams.global_batch_size_to_train_on)
        return CheckpointFacts(self.layout, samples, self.data.fingerprint)

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        """Orbax reshards onto another mesh; ``scan_layers`` and Grain's per-process
        iterator states do not move (``checkpoint.layout_refusal``)."""
        return LoadPlan(refusal=layout_refusal(saved, self.layout, self.hparams))

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """The facts ``baton_maxtext.json`` held before ``baton.json`` recorded them."""
        meta = read_legacy_meta(Path(directory).resolve())
        if meta is None:
            return None
        per_step = int(self.hparams.global_batch_size_to_train_on)
        samples = int(meta["data"].get(BATCHES_KEY, 0)) * per_step
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
            saved = json.loads((directory / HYPERPARAMETERS_FILE).read_text())
            self.steps.restore_hyperparameters_set(saved)

    def restore_maxtext_checkpoint(self, step_dir: str | Path) -> int:
        """Load a checkpoint MaxText's own loop wrote (``<checkpoint_dir>/<name>``).

        Returns the baton step to continue from (``name + 1`` optimizer updates); the
        data stream moves to the same point (one global batch per step; a Grain
        iterator from its saved state).
        """
        data = self.data
        step_dir = Path(step_dir).resolve()
        if not step_dir.name.isdigit():
            raise ValueError(f"{step_dir} is not a MaxText checkpoint step directory (<dir>/<n>)")
        updates = self._restore(step_dir.parent, int(step_dir.name))
        if updates != baton_step_of_maxtext_checkpoint(int(step_dir.name)):
            raise ValueError(
                f"{step_dir}: MaxText checkpoint {step_dir.name} holds optimizer step {updates}, "
                f"expected {baton_step_of_maxtext_checkpoint(int(step_dir.name))}"
            )
        if data.batches is not None:
            data.batches.skip_to(updates)
        elif data.dataset_type != "grain":
            self._restore_data_position({"pipeline": data.dataset_type, BATCHES_KEY: updates})
        data.batches_read = updates
        return updates

    def _restore(self, root: Path, name: int) -> int:
        """Step ``name`` under ``root`` onto the live state; returns the optimizer step."""
        state = self._state()
        restore_state(self.hparams, state, self.data.iterator, root, name)
        return optimizer_step(state)

    def _restore_data_position(self, data: Mapping[str, Any]) -> None:
        run_data = self.data
        if isinstance(run_data.batches, RolloutBatches):
            run_data.batches.load_state_dict(dict(data))  # refuses another stream's state
            run_data.batches_read = run_data.batches.batches_read
            return
        if run_data.batches is not None:
            if BATCHES_KEY in data and "seed" not in data:
                raise ValueError(
                    "the checkpoint was written by MaxText's own data pipeline; "
                    "resume with the same data_path and tokenizer"
                )
            run_data.batches.load_state_dict(dict(data))
            run_data.batches_read = run_data.batches.batches_read
            return
        if data.get("pipeline") != run_data.dataset_type:
            raise ValueError(
                f"the checkpoint's data came from {data.get('pipeline', 'baton bytes')!r}, this "
                f"run reads {run_data.dataset_type!r}; resume with the same data settings"
            )
        batches_read = int(data[BATCHES_KEY])
        if run_data.dataset_type != "grain":
            # MaxText checkpoints no Hugging Face iterator state: replay the stream's position
            for _ in range(batches_read):
                next(run_data.iterator)
        run_data.batches_read = batches_read
