"""Which items each global batch of a MaxText stream reads: a fresh seeded permutation of
the items per epoch (``seed + epoch``), a whole global batch at a time, resumable at any
global batch size.

The position is the epoch and the items of its order read so far, so batch ``n`` is the
same in every run and a resumed run continues at the next item of the order, also with
another global batch (a run resumed on fewer or more processes). A tail of an epoch's
order shorter than a batch is left out. The byte stream's windows (``byte_stream.py``)
and the prepared post-training rows (``packed_batches.py``) are read in this order.

Example::

    order = EpochOrder(count=100, batch_size=8, seed=0)
    items = order.take()          # the first batch's 8 items; order.batches_read == 1
    order.state_dict()            # {"consumed": 1, "epoch": 0, "position": 8, ...}

No torch and no jax here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the saved position's count of batches handed out, under the key checkpoints have
#: always held it by (older checkpoints load unchanged)
BATCHES_KEY = "consumed"


class EpochOrder:
    """Global batches of ``batch_size`` of ``count`` items, in a seeded order per epoch."""

    def __init__(self, count: int, *, batch_size: int, seed: int = 0) -> None:
        self.count = count
        self.batch_size = batch_size
        self.seed = seed
        self.batches_per_epoch = count // batch_size
        #: batches handed out (over every resume; saved as ``BATCHES_KEY``)
        self.batches_read = 0
        #: the current epoch and the items of its order read so far
        self.epoch = 0
        self.position = 0
        self._epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """The items of epoch ``epoch`` in the order they are read."""
        if epoch != self._epoch:
            self._order = np.random.default_rng(self.seed + epoch).permutation(self.count)
            self._epoch = epoch
        return self._order

    def take(self) -> np.ndarray:
        """The next batch's items (the next epoch's first where this one has too few)."""
        if self.position + self.batch_size > self.count:
            self.epoch, self.position = self.epoch + 1, 0
        chosen = self.permutation(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        self.batches_read += 1
        return chosen

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
        """Continue at the saved item of the saved epoch (any global batch size)."""
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"data stream seed={state['seed']} in the checkpoint differs from this run's "
                f"{self.seed}; resume with the same --data-seed"
            )
        if "position" not in state:  # written before positions were kept: batches of its size
            saved = EpochOrder(self.count, batch_size=int(state["batch_size"]), seed=self.seed)
            saved.skip_to(int(state[BATCHES_KEY]))
            state = {**state, "epoch": saved.epoch, "position": saved.position}
        self.batches_read = int(state[BATCHES_KEY])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
