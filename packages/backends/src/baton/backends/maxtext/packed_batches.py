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

For DPO a batch also carries ``reference_logps`` (float32, ``[B, max_documents_per_row]``):
the reference model's log-probability of each document (0 where the row has none).

Rows are read in a shuffled order, a fresh permutation per epoch (seed + epoch), a whole
global batch of rows per step: every process builds the same batch and MaxText's loader
keeps each device's part. A preference pair lives in one row, so it is never split
across micro-batches or ranks. No jax here.

Example::

    batches = PackedBatches(PackedDataset("data/chat"), batch_size=8, seed=0)
    batch = next(batches)          # {"inputs": int32 [8, seq_len], ...}
    batches.state_dict()           # {"consumed": 1 (batches), "epoch": 0, "position": 8, ...}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from baton.backends.maxtext.byte_stream import BATCHES_KEY
from baton.data.packed import PackedBatch, PackedDataset


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
    batch: PackedBatch, reference: np.ndarray | None = None, length: int | None = None
) -> dict[str, np.ndarray]:
    """MaxText's batch dict from ``batch``, padded to ``length`` tokens (padding is segment
    0: unsupervised, attended by nothing else); ``reference`` (one log-probability per
    sequence of the dataset) adds each row's documents' values as ``reference_logps``."""
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
    if reference is not None:
        present = batch.documents >= 0
        values = reference[np.where(present, batch.documents, 0)]
        arrays["reference_logps"] = np.where(present, values, 0.0).astype(np.float32)
    return arrays


class PackedBatches:
    """Global batches of ``batch_size`` rows of ``data`` in a seeded shuffled order, as
    MaxText batch dicts of ``length`` tokens, resumable (``state_dict``); ``reference`` as
    in :func:`maxtext_batch`. A tail of an epoch shorter than a batch is left out."""

    def __init__(
        self,
        data: PackedDataset,
        *,
        batch_size: int,
        seed: int = 0,
        length: int | None = None,
        reference: np.ndarray | None = None,
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
        self.reference = reference
        self.batches_per_epoch = data.num_rows // batch_size
        #: batches handed out (saved as ``BATCHES_KEY``), the current epoch and the rows of
        #: its order read so far
        self.batches_read = 0
        self.epoch = 0
        self.position = 0

    def __iter__(self) -> PackedBatches:
        return self

    def order(self, epoch: int) -> np.ndarray:
        """The rows of epoch ``epoch`` in the order they are read."""
        return np.random.default_rng(self.seed + epoch).permutation(self.data.num_rows)

    def rows(self, index: int) -> np.ndarray:
        """The rows of the ``index``-th batch from the start (0-based)."""
        epoch, within = divmod(index, self.batches_per_epoch)
        start = within * self.batch_size
        return self.order(epoch)[start : start + self.batch_size]

    def __next__(self) -> dict[str, np.ndarray]:
        if self.position + self.batch_size > self.data.num_rows:
            self.epoch, self.position = self.epoch + 1, 0
        rows = self.order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        self.batches_read += 1
        packed = self.data.batch([int(r) for r in rows])
        return maxtext_batch(packed, self.reference, self.length)

    def skip_to(self, batches: int) -> None:
        """The position after ``batches`` batches of this size from the start."""
        epoch, within = divmod(batches, self.batches_per_epoch)
        self.batches_read, self.epoch, self.position = batches, epoch, within * self.batch_size

    def state_dict(self) -> dict[str, Any]:
        return {
            BATCHES_KEY: self.batches_read,
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved row of the saved epoch (any global batch size)."""
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"data stream seed={state['seed']} in the checkpoint differs from this run's "
                f"{self.seed}; resume with the same --data-seed"
            )
        self.batches_read = int(state[BATCHES_KEY])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
