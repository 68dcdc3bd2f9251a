"""The training data of the JAX backend: any iterable of batches, with a position that a
checkpoint records and a resume restores.

A batch is a dict (or any pytree) of numpy arrays whose leading axis is the batch. Each
process iterates its own share of the global batch (on several JAX processes the
arrays are joined along the leading axis across processes).

Two kinds of sources, one stream:

- a **stateful iterator**: one with ``get_state()``/``set_state(state)`` (grain's
  ``DataLoader`` iterator, a ``grain.IterDataset`` iterator) or
  ``state_dict()``/``load_state_dict(state)``. Its own state is saved, so a resumed run
  sees exactly the batches an uninterrupted run would.
- a **plain iterable** (a list, a generator function, any object with ``__iter__``): the
  stream counts the batches read in the current epoch. On resume it re-creates the
  iterator and draws and discards that many batches, which reproduces the position when
  iterating is deterministic (same data, same shuffling seed). A one-shot iterator
  (a generator object) cannot be re-created: pass a factory (``lambda: my_batches()``)
  or a re-iterable instead.

At the end of an epoch the stream either starts the next one (``on_data_end="restart"``:
a fresh iterator; needs a factory or a re-iterable) or raises ``DataExhausted``
(``on_data_end="stop"``: the driver ends the run in order at the last complete step),
never waits; a source that cannot yield another batch raises ``DataUnavailable``.

Example::

    stream = BatchStream(lambda: iter(my_list_of_batches), on_data_end="restart")
    batch = stream.next()
    state = stream.state_dict()        # {"epoch": 0, "consumed": 1, ...} (batches read)
    stream.load_state_dict(state)      # re-creates and skips (or restores the iterator)
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from baton.core.backend import DataExhausted

DataEnd = Literal["restart", "stop"]
#: the saved position's count of batches read in the epoch, under the key checkpoints
#: have always held it by (older checkpoints load unchanged)
BATCHES_KEY = "consumed"


class DataUnavailable(RuntimeError):
    """The training data cannot yield another batch (a one-shot iterator at its end, an
    empty source): an error, unlike ``DataExhausted``, which ends the run in order."""


def _iterator_state(iterator: Any) -> Any:
    """The iterator's own state (JSON-serialisable), or ``None`` when it has none."""
    if hasattr(iterator, "get_state") and hasattr(iterator, "set_state"):
        state = iterator.get_state()
    elif hasattr(iterator, "state_dict") and hasattr(iterator, "load_state_dict"):
        state = iterator.state_dict()
    else:
        return None
    if isinstance(state, bytes):  # grain's DataLoader iterator: JSON bytes
        return {"bytes": base64.b64encode(state).decode("ascii")}
    return {"value": state}


def _set_iterator_state(iterator: Any, saved: dict[str, Any]) -> None:
    state = base64.b64decode(saved["bytes"]) if "bytes" in saved else saved["value"]
    if hasattr(iterator, "set_state"):
        iterator.set_state(state)
    else:
        iterator.load_state_dict(state)


class BatchStream:
    """Batches from ``source`` (an iterable, or a zero-argument factory returning one)."""

    def __init__(
        self,
        source: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        on_data_end: DataEnd = "restart",
    ) -> None:
        if on_data_end not in ("restart", "stop"):
            raise ValueError(f"on_data_end must be 'restart' or 'stop', got {on_data_end!r}")
        if not callable(source) and not isinstance(source, Iterable):
            raise TypeError(
                f"training data must be an iterable of batches or a factory returning one, "
                f"got {type(source).__name__}"
            )
        self.source = source
        self.on_data_end = on_data_end
        #: completed epochs
        self.epoch = 0
        #: batches drawn in the current epoch (saved as ``"consumed"``, its key on disk)
        self.batches_read = 0
        self._iterator: Iterator[Any] | None = None

    # -- iteration ------------------------------------------------------------------
    @property
    def one_shot(self) -> bool:
        """An iterator (a generator object...): it cannot be started again."""
        return isinstance(self.source, Iterator)

    def _fresh(self) -> Iterator[Any]:
        if callable(self.source) and not isinstance(self.source, Iterable):
            made = self.source()
            if not isinstance(made, Iterable):
                raise TypeError(
                    f"the training data factory returned {type(made).__name__}, not an iterable "
                    "of batches"
                )
            return iter(made)
        return iter(self.source)  # type: ignore[arg-type]

    @property
    def iterator(self) -> Iterator[Any]:
        if self._iterator is None:
            self._iterator = self._fresh()
        return self._iterator

    @property
    def stateful(self) -> bool:
        """Whether the iterator saves its own position (``get_state``/``state_dict``)."""
        return _iterator_state(self.iterator) is not None

    def next(self) -> Any:
        """The next batch; at the end of an epoch start the next one or raise."""
        try:
            batch = next(self.iterator)
        except StopIteration:
            batch = self._next_epoch()
        self.batches_read += 1
        return batch

    def _next_epoch(self) -> Any:
        where = f"after {self.batches_read} batches of epoch {self.epoch}"
        if self.on_data_end == "stop":
            raise DataExhausted(
                f"the training data ran out {where} (on_data_end='stop'; 'restart' starts "
                "another epoch)"
            )
        if self.one_shot:
            raise DataUnavailable(
                f"the training data ran out {where} and is a one-shot iterator that cannot "
                "start another epoch; pass a factory (lambda: make_batches()) or a "
                "re-iterable (a list, a grain DataLoader)"
            )
        if self.batches_read == 0:
            raise DataUnavailable("the training data yields no batches at all")
        self.epoch += 1
        self.batches_read = 0
        self._iterator = self._fresh()
        try:
            return next(self._iterator)
        except StopIteration:
            raise DataUnavailable(
                f"epoch {self.epoch} of the training data yields no batches"
            ) from None

    def skip(self, batches: int) -> None:
        """Draw and discard ``batches`` batches (epochs roll over as in training)."""
        for _ in range(batches):
            self.next()

    # -- position -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position: epoch and count, plus the iterator's own state when it has one."""
        state: dict[str, Any] = {"epoch": self.epoch, BATCHES_KEY: self.batches_read}
        own = _iterator_state(self.iterator)
        if own is not None:
            state["iterator"] = own
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move to a saved position: restore the iterator's state, or re-create and skip."""
        epoch, batches = int(state["epoch"]), int(state[BATCHES_KEY])
        if "iterator" in state:
            _set_iterator_state(self.iterator, state["iterator"])
            self.epoch, self.batches_read = epoch, batches
            return
        if self.one_shot and (epoch, batches) != (0, 0):
            raise ValueError(
                f"cannot resume the training data at epoch {epoch}, batch {batches}: it is a "
                "one-shot iterator; pass a factory (lambda: make_batches()) or a re-iterable "
                "so that baton can re-create it and skip to the position"
            )
        self._iterator = self._fresh()
        self.epoch, self.batches_read = epoch, 0
        for _ in range(batches):
            try:
                next(self._iterator)
            except StopIteration:
                raise ValueError(
                    f"cannot resume the training data at batch {batches} of epoch {epoch}: "
                    f"this data has only {self.batches_read} batches per epoch; resume with the "
                    "data the checkpoint was trained on"
                ) from None
            self.batches_read += 1
