"""The data stream of a MaxText run on rollouts (an objective that samples its data,
``Objective.rollouts``: GRPO): each step's ``RolloutBatch`` from the rollout phase as
MaxText's native batch arrays.

The rollout phase (``baton.backends.rollouts.phase``) makes the step's rows before the
step and every process holds the same global batch (``phase.current``, sent by its
``broadcast``). ``RolloutBatches`` is the iterator MaxText's ``DataLoader`` reads once per
step: the whole global batch, as ``PackedBatches`` hands prepared rows, and MaxText's
loader places it on the mesh, each device keeping its share of the rows (contiguous
blocks along the data axes, the same as ``RolloutBatch.rows_of``), its gradient
accumulation cutting that share into micro-batches. Each row is one rollout, so no
rollout is split; the loss is one mean over the global batch's items (``objective_loss``),
so a group of completions may span devices and micro-batches.

The arrays (``packed_batches.maxtext_batch``): the rows' tokens, positions, segments and
``targets_segmentation`` (the completion's targets), the rows' ``documents`` (``[N, 1]``:
the rollout's index in the step), the document value ``advantages`` (``[N, 1]``) and the
token values ``old_logps`` and, with a KL term, ``ref_logps``, right-padded to MaxText's
``max_target_length``. The shapes are the same every step (rows per step x
``max_target_length``), so MaxText's step compiles once; with ``num_iterations`` > 1 the
phase hands the same batch again and it is fed again.

The stream keeps no position of its own: the phase's state (prompt order, sampler, the
batch not yet used up) is saved in every checkpoint by the driver. It counts the batches
it handed out, which a checkpoint records as the samples seen; the run's data fingerprint
is the prompts' (``prompts_fingerprint``: a resume on other prompts is refused).

Example::

    batches = RolloutBatches(phase, rows=16, length=64,   # phase: a RolloutSource
                             document_values=run.objective.document_values)
    batch = next(batches)   # {"inputs": int32 [N, T], ..., "advantages": float32 [N, 1],
                            #  "old_logps": float32 [N, T]}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from baton.backends.maxtext.epoch_order import BATCHES_KEY
from baton.backends.maxtext.packed_batches import maxtext_batch
from baton.core.errors import UsageError
from baton.data.prompts import PreparedPrompts, records_path
from baton.data.rollouts import RolloutBatch

#: what a checkpoint's ``data.json`` says this stream is (``"pipeline"``)
ROLLOUTS_PIPELINE = "rollouts"


class RolloutSource(Protocol):
    """Where the rows of each step come from: the rollout phase
    (``baton.backends.rollouts.phase.RolloutPhase``)."""

    #: rollouts the phase makes per step (over every process)
    rows_per_step: int

    @property
    def current(self) -> RolloutBatch | None:
        """The batch of the current step (``None`` before the first step)."""
        ...


def prompts_fingerprint(prefix: str) -> str:
    """A short hash of prepared prompts: their manifest and the sizes of their files."""
    prompts = PreparedPrompts(prefix)
    files = [Path(prompts.prefix + ".bin"), Path(prompts.prefix + ".idx"), records_path(prefix)]
    facts = {"manifest": prompts.manifest, "sizes": [f.stat().st_size for f in files]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def rollout_arrays(
    batch: RolloutBatch, length: int | None = None, document_values: Collection[str] = ()
) -> dict[str, np.ndarray]:
    """MaxText's batch dict of ``batch``'s rows, padded to ``length`` tokens, with every
    value the batch carries: those named in ``document_values`` (the objective's
    declaration) one per rollout (``[N, 1]``), the others one per token (``[N, T]``)."""
    documents: dict[str, np.ndarray] = {}
    tokens: dict[str, np.ndarray] = {}
    for name, array in batch.values.items():
        if name in document_values:
            documents[name] = _per_document(batch, array)
        else:
            tokens[name] = array
    return maxtext_batch(
        batch.rows, length, documents=True, document_values=documents, token_values=tokens
    )


def _per_document(batch: RolloutBatch, array: np.ndarray) -> np.ndarray:
    """A ``[N, 1]`` value as one value per document index (the rollout's index in the
    step, ``RolloutBatch``'s ``documents``), as ``maxtext_batch`` looks values up."""
    documents = batch.rows.documents[:, 0]
    values = np.zeros(int(documents.max()) + 1 if documents.size else 0, dtype=np.float32)
    values[documents] = array[:, 0]
    return values


class RolloutBatches:
    """The rollout phase's current batch as MaxText batch dicts of ``length`` tokens, one
    per step (see the module's text). ``rows`` is MaxText's global batch, which must be
    the phase's rollouts per step (``UsageError`` otherwise, before anything is sampled);
    ``document_values`` names the objective's values that are one per rollout."""

    pipeline = ROLLOUTS_PIPELINE

    def __init__(
        self,
        source: RolloutSource,
        *,
        rows: int,
        length: int,
        document_values: Collection[str] = (),
    ) -> None:
        if source.rows_per_step != rows:
            raise UsageError(
                f"the rollout phase samples {source.rows_per_step} rollouts a step, MaxText's "
                f"global batch is {rows} rows (per-device batch x devices x gradient "
                "accumulation); give the phase MaxText's global batch as rows_per_step"
            )
        self.source = source
        self.rows = rows
        self.length = length
        self.document_values = tuple(document_values)
        #: batches handed out, over every resume (saved as ``BATCHES_KEY``)
        self.batches_read = 0

    def __iter__(self) -> RolloutBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.source.current
        if batch is None:
            raise RuntimeError(
                "the rollout phase has made no rollouts yet: the driver calls it before "
                "each step (Driver(..., rollouts=phase))"
            )
        if batch.size != self.rows:
            raise ValueError(f"the rollout phase made {batch.size} rollouts, not {self.rows}")
        self.batches_read += 1
        return rollout_arrays(batch, self.length, self.document_values)

    def skip_to(self, batches: int) -> None:
        """The count after ``batches`` steps (the rollouts themselves are the phase's)."""
        self.batches_read = batches

    def state_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, BATCHES_KEY: self.batches_read}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The count a checkpoint of a run on rollouts saved (another stream's state is a
        ``ValueError`` naming both)."""
        if state.get("pipeline") != self.pipeline:
            saved = state.get("pipeline", "prepared rows or text")
            raise ValueError(
                f"the checkpoint's data came from {saved!r}, this run trains on rollouts; "
                "resume a run of the same objective"
            )
        self.batches_read = int(state[BATCHES_KEY])
