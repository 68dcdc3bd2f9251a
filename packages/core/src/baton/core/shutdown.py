"""How a run ends, cleanly or after an error: what must still happen, each step guarded
so that one failure does not keep the next from running.

Example (what ``Driver`` does when its body returns, or raises ``error``)::

    end_run(backend, saver, hooks)           # clean end
    end_run(backend, saver, hooks, error)    # after an error

``hooks(name, *args)`` calls each callback's hook, logging an error and going on to the
next (``Dispatcher.call_each_guarded`` with the driver bound).

After an error, checkpoints already being written are complete work: they are finished
(without collectives, which a failed rank may never join), then ``on_exception`` runs.
Always, then: ``backend.teardown()``, ``on_teardown`` and the saver's thread stopped.
Every handler's error is logged, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from baton.core.backend import Backend
from baton.core.checkpoints.saving import CheckpointSaver

log = logging.getLogger("baton")


def end_run(
    backend: Backend,
    saver: CheckpointSaver,
    hooks: Callable[..., None],
    error: BaseException | None = None,
) -> None:
    """End the run: after ``error``, finish the saves in flight and call each
    ``on_exception(driver, error)``; then ``backend.teardown()``, each
    ``on_teardown(driver)``, and stop the saver's thread."""
    if error is not None:
        try:
            saver.poll(block=True, collective=False)
        except Exception as save_error:
            log.error("a pending checkpoint failed while handling an error: %r", save_error)
        hooks("on_exception", error)
    try:
        backend.teardown()
    except Exception as teardown_error:
        log.error("backend teardown raised %r", teardown_error)
    hooks("on_teardown")
    saver.close()
