"""TorchTitan's batches for baton's steps, counted: the tokens, samples and data wait
one step reads (TorchTitan's ``Trainer.train`` counts the same in its own loop).

Example (what ``TorchTitanBackend.train_step`` does)::

    batches = CountedBatches(trainer)   # after setup, and again after a resume
    batches.start_step()
    trainer.train_step(batches)         # reads as many batches as gradient accumulation needs
    batches.tokens, batches.samples, batches.wait_s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any


class CountedBatches:
    """An iterator over ``trainer.batch_generator(trainer.dataloader)`` that counts what
    it hands out since :meth:`start_step`. ``take``, if given, sees each batch's input
    dict and labels first (``row_feed.RowFeed.take`` removes the rows' documents and
    values, which the model must not see)."""

    def __init__(
        self, trainer: Any, take: Callable[[dict[str, Any], Any], None] | None = None
    ) -> None:
        self._batches: Iterator[Any] = trainer.batch_generator(trainer.dataloader)
        self._take = take
        #: label tokens, sequences and seconds spent waiting for data, this step
        self.tokens = 0
        self.samples = 0
        self.wait_s = 0.0

    def start_step(self) -> None:
        """Count from zero again (call before each step)."""
        self.tokens = self.samples = 0
        self.wait_s = 0.0

    def __iter__(self) -> CountedBatches:
        return self

    def __next__(self) -> tuple[Any, Any]:
        started = time.perf_counter()
        try:
            input_dict, labels = next(self._batches)
        finally:
            self.wait_s += time.perf_counter() - started
        if self._take is not None:
            self._take(input_dict, labels)
        self.tokens += labels.numel()
        self.samples += labels.shape[0]
        return input_dict, labels
