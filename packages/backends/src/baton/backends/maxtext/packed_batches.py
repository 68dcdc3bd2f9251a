"""Prepared post-training rows (``baton.data.packed``) as MaxText's native batch arrays.

A ``PackedBatch`` becomes the dict MaxText's ``train_step`` reads, with nothing added to
MaxText's model or loss:

- ``inputs`` / ``targets``: the row's tokens and the next ones;
- ``inputs_position`` / ``targets_position``: positions that restart at 0 in each document
  (MaxText's rotary embedding reads them);
- ``inputs_segmentation``: the document number of each token (1..k, 0 on padding):
  MaxText's attention lets a token see only tokens of its own segment, so no document
  sees another;
- ``targets_segmentation``: the document number where the target is supervised, 0
  elsewhere: MaxText's loss weighs each target by ``targets_segmentation != 0``, so the
  loss is the mean over the supervised tokens of the global batch.

For an objective computed by baton's loss (not MaxText's cross entropy:
``objective_loss``) a batch also carries ``documents`` (int32, ``[B,
max_documents_per_row]``: each row's documents' global indices, -1 where the row has
fewer), the objective's document values (float32, the same shape, 0 where the row has
no document), such as DPO's ``reference_logps``, the reference model's log-probability of
each document, and its token values (float32 ``[B, length]``, right-padded with 0), such
as GRPO's ``old_logps``. MaxText's train step splits every array of the batch along its
rows, so they travel with their rows through its gradient accumulation and data
sharding.

Rows are read in a shuffled order, a fresh permutation per epoch (seed + epoch), a whole
global batch of rows per step: every process builds the same batch and MaxText's loader
keeps each device's part. A preference pair lives in one row, so it is never split
across micro-batches or ranks. No jax here.

Example::

    batches = PackedBatches(PackedDataset("data/chat"), batch_size=8, seed=0)
    batch = next(batches)          # {"inputs": int32 [8, seq_len], ...}
    pairs = PackedBatches(PackedDataset("data/pairs"), batch_size=8, documents=True,
                          document_values={"reference_logps": logps})   # [num_sequences]
    batches.state_dict()           # {"consumed": 1 (batches), "epoch": 0, "position": 8, ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from baton.backends.maxtext.epoch_order import EpochOrder
from baton.data.packed import PackedBatch, PackedDataset

#: the batch array of each row's documents' global indices (``Rows.documents``)
DOCUMENTS_KEY = "documents"


def padded(array: np.ndarray, length: int | None) -> np.ndarray:
    """``array`` as int32, padded with zeros on the right to ``length`` columns."""
    width = array.shape[1]
    if length is not None and length < width:
        raise ValueError(
            f"prepared rows hold {width} inputs, more than the model's max_target_length "
            f"{length}; pass --seq-len {width} (or more)"
        )
    extra = 0 if length is None else length - width
    return np.pad(np.asarray(array, dtype=np.int32), ((0, 0), (0, extra)))


def maxtext_batch(
    batch: PackedBatch,
    length: int | None = None,
    *,
    documents: bool = False,
    document_values: Mapping[str, np.ndarray] | None = None,
    token_values: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """MaxText's batch dict from ``batch``, padded to ``length`` tokens (padding is segment
    0: unsupervised, attended by nothing else). ``documents`` adds each row's documents'
    global indices (``DOCUMENTS_KEY``); ``document_values`` (each one value per sequence
    of the dataset) add each row's documents' values under their names; ``token_values``
    (each one value per input token of each row, ``[B, width]``) are added under their
    names, padded with 0 like the rows."""
    positions = padded(batch.positions, length)
    segments = padded(batch.segments, length)
    arrays = {
        "inputs": padded(batch.inputs, length),
        "inputs_position": positions,
        "inputs_segmentation": segments,
        "targets": padded(batch.targets, length),
        "targets_position": positions.copy(),
        "targets_segmentation": padded(np.where(batch.loss_mask, batch.segments, 0), length),
    }
    if documents:
        arrays[DOCUMENTS_KEY] = np.asarray(batch.documents, dtype=np.int32)
    present = batch.documents >= 0
    for name, per_sequence in (document_values or {}).items():
        values = per_sequence[np.where(present, batch.documents, 0)]
        arrays[name] = np.where(present, values, 0.0).astype(np.float32)
    for name, per_token in (token_values or {}).items():
        arrays[name] = padded_values(per_token, length)
    return arrays


def padded_values(array: np.ndarray, length: int | None) -> np.ndarray:
    """``array`` (``[B, width]``) as float32, padded with zeros on the right to ``length``
    columns."""
    extra = 0 if length is None else length - array.shape[1]
    if extra < 0:
        raise ValueError(f"token values of {array.shape[1]} columns exceed {length} tokens")
    return np.pad(np.asarray(array, dtype=np.float32), ((0, 0), (0, extra)))


class PackedBatches:
    """Global batches of ``batch_size`` rows of ``data`` in an ``EpochOrder`` of the rows
    (``epoch_order.py``: a seeded shuffled order per epoch, resumable at another global
    batch), as MaxText batch dicts of ``length`` tokens; ``documents`` and
    ``document_values`` as in :func:`maxtext_batch`."""

    def __init__(
        self,
        data: PackedDataset,
        *,
        batch_size: int,
        seed: int = 0,
        length: int | None = None,
        documents: bool = False,
        document_values: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if data.num_rows < batch_size:
            raise ValueError(
                f"{data.num_rows} prepared rows are fewer than one global batch ({batch_size}); "
                "use a smaller --batch-size or more data"
            )
        self.data = data
        self.batch_size = batch_size
        self.seed = seed
        self.length = length
        self.documents = documents
        self.document_values = dict(document_values or {})
        #: which rows each batch reads, and the position (epoch, rows read)
        self.order = EpochOrder(data.num_rows, batch_size=batch_size, seed=seed)

    @property
    def batches_read(self) -> int:
        """Batches handed out, over every resume (saved as ``BATCHES_KEY``)."""
        return self.order.batches_read

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        packed = self.data.batch([int(r) for r in self.order.take()])
        return maxtext_batch(
            packed, self.length, documents=self.documents, document_values=self.document_values
        )

    def skip_to(self, batches: int) -> None:
        """The position after ``batches`` batches of this size from the start."""
        self.order.skip_to(batches)

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved row of the saved epoch (any global batch size)."""
        self.order.load_state_dict(state)
