"""One background thread that runs submitted work in order, so logging leaves the loop.

Example::

    thread = LogThread(write)          # write(step, metrics, phase) runs on the thread
    thread.submit(10, {"loss": 2.3}, "train")
    thread.flush()                     # everything submitted so far is done
    thread.close()                     # flush, then stop the thread

``submit`` only queues its arguments (about a microsecond); the queue is bounded, so a
writer that falls far behind makes ``submit`` wait rather than holding ever more records
in memory. Nothing submitted is dropped: ``flush`` and ``close`` wait for all of it. An
exception the work raises is logged and the thread goes on with the next record.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("baton")

#: records waiting at most; past this ``submit`` waits for the writer
MAX_PENDING = 1024
_STOP = object()


class LogThread:
    """Call ``work(*args)`` for each ``submit(*args)``, in order, on one daemon thread."""

    def __init__(
        self,
        work: Callable[..., None],
        *,
        max_pending: int = MAX_PENDING,
        name: str = "baton-log-writer",
    ) -> None:
        self.work = work
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, *args: Any) -> None:
        """Queue one call of ``work(*args)``; done inline once the thread has stopped."""
        if self._thread.is_alive():
            self._queue.put(args)
        else:
            self._call(args)

    def flush(self) -> None:
        """Return when every call submitted before has finished."""
        if self._thread.is_alive():
            self._queue.join()

    def close(self) -> None:
        """Finish every submitted call, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._call(item)
            finally:
                self._queue.task_done()

    def _call(self, args: tuple[Any, ...]) -> None:
        try:
            self.work(*args)
        except Exception:
            log.exception("the log writer thread's %r raised; it goes on", self.work)
