"""The training data one epoch at a time, one batch ahead, as ``Trainer.fit`` reads it.

Lightning's fit loop fetches each batch before running the previous one: it knows that a
batch is its epoch's last before training on it (the optimizer steps on a partial
accumulation window there) and never starts the next epoch's iterator before the epoch's
end hooks and validation have run. ``EpochStream`` reads the data the same way; its
position is saved and restored like ``LoaderStream``'s (the batches read in the
epoch, skipped on resume from the epoch's starting RNG state).

Example::

    stream = EpochStream(loader)
    stream.begin()                                  # the epoch's iterator, first batch fetched
    batch, batch_idx, is_last = stream.next_batch()
    if stream.epoch_done:
        stream.end_epoch()                          # the next begin() starts epoch 1
"""

from __future__ import annotations

import time
from typing import Any

from baton.backends.fabric.stream import LoaderStream

_END = object()


class EpochStream(LoaderStream):
    """One epoch at a time, one batch fetched ahead (``Trainer.fit``'s prefetch)."""

    def __init__(self, data: Any) -> None:
        super().__init__(data, use_loader_state=False)
        self._ahead: Any = _END
        #: seconds spent fetching batches since the last ``take_wait``
        self.waited_s = 0.0

    @property
    def started(self) -> bool:
        """Whether the current epoch's iterator exists."""
        return self._iterator is not None

    @property
    def epoch_done(self) -> bool:
        """The current epoch has handed out its last batch (its end is still to run)."""
        return self._iterator is not None and self._ahead is _END

    def begin(self) -> None:
        """Start the epoch: make its iterator and fetch its first batch."""
        self._start()
        self._ahead = self._fetch()
        if self._ahead is _END:
            raise ValueError(
                f"the training data ({type(self.data).__name__}) yielded no batch in epoch "
                f"{self.epoch}: it is empty (check its length and batch size)"
            )

    def next_batch(self) -> tuple[Any, int, bool]:
        """``(batch, its index in the epoch, whether it is the epoch's last)``."""
        assert self._ahead is not _END, "begin() the epoch first"
        batch = self._ahead
        self._ahead = self._fetch()
        self.batches += 1
        return batch, self.batches - 1, self._ahead is _END

    def end_epoch(self) -> None:
        """The epoch is over: the next ``begin`` starts the following one."""
        self.epoch += 1
        self.batches = 0
        self._iterator = None
        self._ahead = _END

    def take_wait(self) -> float:
        """Seconds spent fetching batches since the last call (a step's data wait)."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def _fetch(self) -> Any:
        assert self._iterator is not None
        started = time.perf_counter()
        try:
            return next(self._iterator)
        except StopIteration:
            return _END
        finally:
            self.waited_s += time.perf_counter() - started

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._ahead = self._fetch() if self._iterator is not None else _END
