"""How a run ends, cleanly or after an error: what must still happen, each step guarded
so that one failure does not keep the next from running.

After an error (``Driver``'s ``_running`` calls these, in this order)::

    finish_after_error(saver, error, on_exception=[cb.on_exception, ...], driver=driver)
    tear_down(backend, saver, on_teardown=[cb.on_teardown, ...], driver=driver)

A clean end calls ``tear_down`` alone. Checkpoints already being written are complete
work: they are finished (without collectives, which a failed rank may never join)
before ``on_exception`` runs; every handler's error is logged, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from baton.core.backend import Backend
from baton.core.saving import CheckpointSaver

log = logging.getLogger("baton")


def finish_after_error(
    saver: CheckpointSaver,
    error: BaseException,
    *,
    on_exception: Sequence[Callable[..., Any]],
    driver: Any,
) -> None:
    """Finish the saves in flight, then call each ``on_exception(driver, error)``."""
    try:
        saver.poll(block=True, collective=False)
    except Exception as save_error:
        log.error("a pending checkpoint failed while handling an error: %r", save_error)
    _call_each("on_exception", on_exception, driver, error)


def tear_down(
    backend: Backend,
    saver: CheckpointSaver,
    *,
    on_teardown: Sequence[Callable[..., Any]],
    driver: Any,
) -> None:
    """``backend.teardown()``, each ``on_teardown(driver)``, then stop the saver's thread."""
    try:
        backend.teardown()
    except Exception as error:
        log.error("backend teardown raised %r", error)
    _call_each("on_teardown", on_teardown, driver)
    saver.close()


def _call_each(hook: str, handlers: Sequence[Callable[..., Any]], *args: Any) -> None:
    """Call every handler of ``hook``; an error is logged and the next handler runs."""
    for handler in handlers:
        try:
            handler(*args)
        except Exception as error:
            log.error("%s handler %r raised %r", hook, handler, error)
