"""A save written in the background, as the driver's ``PendingSave``: for every backend
whose write is a future (a writer thread's, orbax's ``save_async`` response).

Example::

    saves = BackgroundSaves()
    pending = saves.submit(lambda: write(directory, state))  # a FuturePendingSave
    ...                      # training continues
    pending.wait()           # re-raises what the write raised
    saves.close()            # at teardown

    pending = FuturePendingSave(ocp.save_async(path, state))  # orbax's own future
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class FuturePendingSave:
    """A write in flight behind a future (anything with ``result(timeout=...)``):
    ``done`` polls, ``wait`` returns once it is written or raises what the write raised."""

    def __init__(self, future: Any) -> None:
        self._future = future
        self._finished = False

    def done(self) -> bool:
        if not self._finished:
            try:
                self._future.result(timeout=0)
            except TimeoutError:
                return False
            except Exception:  # failed: ``wait`` raises it
                pass
            self._finished = True
        return True

    def wait(self) -> None:
        self._future.result()
        self._finished = True


class BackgroundSaves:
    """One writer thread: saves are written one after the other, in the order
    submitted (so every process meets a writer's cross-process barriers in the same
    order)."""

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
