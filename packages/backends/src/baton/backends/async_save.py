"""Asynchronous saving, one implementation for every backend: the handle the driver
polls (``PendingSave``), the writer thread, waiting, errors, and the gate that holds the
optimizer step while a save still copies the state.

A backend's own code is only what its framework asks for:

- the handle: ``SaveHandle`` does the bookkeeping (``done`` polls until it turns true
  and stays true; ``wait`` joins and re-raises what the write raised); a subclass names
  the framework's two calls, ``_poll`` and ``_join``. ``FuturePendingSave`` is the one
  for any future (orbax's ``save_async``, DCP's ``async_save``, a writer thread's);
- the writer: ``BackgroundSaves`` runs saves on one thread, one after the other, in
  the order submitted (every process meets a writer's cross-process barriers in the
  same order); ``close`` at teardown waits for the last;
- staging: ``StagingGate`` lets a save copy the live state on the writer thread while
  the next step's forward and backward run, and holds that step's optimizer update
  until the copy is taken.

Example::

    saves, gate = BackgroundSaves(), StagingGate()

    def save(directory):
        copied = gate.begin()                   # the optimizer step waits from now
        def write():
            with copied:                        # released when the copy is taken
                snapshot = copy_of(state)
            torch.save(snapshot, directory / "state.pt")
        return saves.submit(write)              # a FuturePendingSave

    gate.wait()                                 # before each optimizer step
    saves.close()                               # at teardown

    class DcpSave(FuturePendingSave):           # a framework's handle: its own join
        def _join(self):
            checkpointer.maybe_wait_for_saving()
            super()._join()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


class SaveHandle:
    """An asynchronous save in flight (the driver's ``PendingSave``).

    ``done`` asks ``_poll`` until it answers true, then stays true without asking
    again; ``wait`` calls ``_join`` (which returns once the save is written, or raises
    what the write raised) and the handle is done from then on, failed or not.
    """

    _finished = False

    def _poll(self) -> bool:
        """Whether the save has finished (written or failed), without blocking."""
        raise NotImplementedError

    def _join(self) -> None:
        """Block until the save is written; raise what the write raised."""
        raise NotImplementedError

    def done(self) -> bool:
        if not self._finished:
            self._finished = self._poll()
        return self._finished

    def wait(self) -> None:
        try:
            self._join()
        finally:
            self._finished = True


class FuturePendingSave(SaveHandle):
    """A write in flight behind a future (anything with ``result(timeout=...)``):
    ``done`` polls, ``wait`` returns once it is written or raises what the write raised."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def _poll(self) -> bool:
        try:
            self._future.result(timeout=0)
        except TimeoutError:
            return False
        except Exception:  # failed: ``wait`` raises it
            pass
        return True

    def _join(self) -> None:
        self._future.result()


class BackgroundSaves:
    """One writer thread: saves are written one after the other, in the order
    submitted (so every process meets a writer's cross-process barriers in the same
    order). The thread starts with the first save; ``close`` stops it."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, write: Callable[[], None]) -> FuturePendingSave:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="baton-save")
        return FuturePendingSave(self._executor.submit(write))

    def close(self) -> None:
        """Wait for the saves still being written and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class StagingGate:
    """Holds back what would change a state that a background save is still copying.

    ``begin`` (in the loop, when the save starts) shuts the gate and returns a context
    manager for the writer thread, which opens the gate when its block ends, whether
    the copy succeeded or not (an error surfaces in the save handle's ``wait``).
    ``wait`` (before an optimizer step, a load, the next save) blocks while it is shut.
    """

    def __init__(self) -> None:
        self._copied: threading.Event | None = None

    def begin(self) -> Any:
        copied = self._copied = threading.Event()

        @contextmanager
        def copying() -> Iterator[None]:
            try:
                yield
            finally:
                copied.set()

        return copying()

    def wait(self) -> None:
        """Block until the save that last called ``begin`` has taken its copy."""
        copied = self._copied
        if copied is not None:
            copied.wait()
            self._copied = None
