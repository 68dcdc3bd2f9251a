"""Byte-level text batches in MaxText's batch format, resumable, with numpy only.

The corpus is real text: by default the Python language reference that ships with
every CPython (``pydoc_data.topics``, about 490 kB), so it works offline; ``path=``
reads any UTF-8 file instead. The tokenizer is the identity on UTF-8 bytes (ids
0-255), so the model's ``vocab_size`` must be at least 256.

Each batch is what MaxText's ``train_step`` consumes: a dict of int32 ``[B, L]``
arrays ``inputs``, ``inputs_position``, ``inputs_segmentation``, ``targets``,
``targets_position``, ``targets_segmentation`` (one unpadded segment per row, so
every target counts in the loss).

Example::

    corpus = TextCorpus.load()
    batches = TextBatches(corpus.train, batch_size=8, seq_len=64, seed=0)
    batch = next(batches)                 # dict of int32 [8, 64]
    state = batches.state_dict()          # {"consumed": 1, ...} (batches; its key on disk)
    batches.load_state_dict(state)        # a resumed run continues the same order

No torch and no jax here: the MaxText backend runs on a JAX-only install.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.maxtext.epoch_order import EpochOrder
from baton.data.corpus import load_text

BYTE_VOCAB = 256

BATCH_KEYS = (
    "inputs",
    "inputs_position",
    "inputs_segmentation",
    "targets",
    "targets_position",
    "targets_segmentation",
)


@dataclass
class TextCorpus:
    """UTF-8 bytes of a text, split into train and validation parts."""

    train: np.ndarray
    val: np.ndarray
    source: str

    @classmethod
    def load(cls, path: str | Path | None = None, val_fraction: float = 0.05) -> TextCorpus:
        source, text = load_text(path)
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        split = int(len(data) * (1 - val_fraction))
        return cls(train=data[:split], val=data[split:], source=source)

    def fingerprint(self) -> str:
        """A short hash of the training bytes (a resume on different data fails clearly)."""
        return hashlib.sha256(self.train.tobytes()).hexdigest()[:16]


def make_batch(windows: np.ndarray) -> dict[str, np.ndarray]:
    """MaxText's batch dict from ``[B, L + 1]`` token windows (inputs and shifted targets)."""
    rows, length = windows.shape[0], windows.shape[1] - 1
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    ones = np.ones((rows, length), dtype=np.int32)
    return {
        "inputs": np.ascontiguousarray(windows[:, :-1], dtype=np.int32),
        "inputs_position": positions.copy(),
        "inputs_segmentation": ones,
        "targets": np.ascontiguousarray(windows[:, 1:], dtype=np.int32),
        "targets_position": positions.copy(),
        "targets_segmentation": ones.copy(),
    }


class TextBatches:
    """Shuffled non-overlapping windows of ``seq_len + 1`` tokens as MaxText batches, in
    an ``EpochOrder`` of the windows (``epoch_order.py``: a fresh permutation per epoch,
    resumable at another global batch). ``batch_size`` is the global batch (every
    process builds it; ``jax.device_put`` keeps each device's part).
    """

    def __init__(self, data: np.ndarray, *, batch_size: int, seq_len: int, seed: int = 0) -> None:
        self.data = data
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.num_windows = (len(data) - 1) // seq_len
        if self.num_windows < batch_size:
            raise ValueError(
                f"corpus of {len(data)} tokens has {self.num_windows} windows of {seq_len}, "
                f"fewer than one global batch ({batch_size}); use a smaller max_target_length "
                "or per_device_batch_size, or a larger text"
            )
        #: which windows each batch reads, and the position (epoch, windows read)
        self.order = EpochOrder(self.num_windows, batch_size=batch_size, seed=seed)

    @property
    def batches_read(self) -> int:
        """Batches handed out, over every resume (saved as ``BATCHES_KEY``)."""
        return self.order.batches_read

    def __iter__(self) -> TextBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        chosen = self.order.take()
        offsets = chosen[:, None] * self.seq_len + np.arange(self.seq_len + 1)
        return make_batch(self.data[offsets])

    def skip_to(self, batches: int) -> None:
        """The position after ``batches`` batches of this size from the start."""
        self.order.skip_to(batches)

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict() | {"seq_len": self.seq_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved window of the saved epoch (any global batch size)."""
        if int(state["seq_len"]) != self.seq_len:
            raise ValueError(
                f"data stream seq_len={state['seq_len']} in the checkpoint differs from this "
                f"run's {self.seq_len}; resume with the same data settings"
            )
        self.order.load_state_dict(state)


def eval_batches(data: np.ndarray, *, batch_size: int, seq_len: int, num_batches: int) -> list:
    """A fixed set of evenly spaced validation windows (the same at every evaluation)."""
    count = min(batch_size * num_batches, (len(data) - 1) // seq_len)
    count -= count % batch_size
    if count == 0:
        return []
    starts = np.linspace(0, len(data) - seq_len - 2, count).astype(np.int64)
    windows = data[starts[:, None] + np.arange(seq_len + 1)]
    return [make_batch(windows[i : i + batch_size]) for i in range(0, count, batch_size)]
