"""How a run ends, cleanly or after an error: what must still happen, each step guarded
so that one failure does not keep the next from running.

Example (what ``Driver`` does when its body returns, or raises ``error``)::

    end_run(driver, saver, dispatcher)           # clean end
    end_run(driver, saver, dispatcher, error)    # after an error

After an error, checkpoints already being written are complete work: they are finished
(without collectives, which a failed rank may never join), then ``on_exception`` runs.
Always, then: ``backend.teardown()``, ``on_teardown`` and the saver's thread stopped.
Every handler's error is logged, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from baton.core.dispatch import Dispatcher
from baton.core.saving import CheckpointSaver

if TYPE_CHECKING:
    from baton.core.driver import Driver

log = logging.getLogger("baton")


def end_run(
    driver: Driver,
    saver: CheckpointSaver,
    dispatcher: Dispatcher,
    error: BaseException | None = None,
) -> None:
    """End ``driver``'s run: after ``error``, finish the saves in flight and call each
    ``on_exception(driver, error)``; then ``backend.teardown()``, each
    ``on_teardown(driver)``, and stop the saver's thread."""
    if error is not None:
        try:
            saver.poll(block=True, collective=False)
        except Exception as save_error:
            log.error("a pending checkpoint failed while handling an error: %r", save_error)
        _call_each("on_exception", dispatcher.handlers("on_exception"), driver, error)
    try:
        driver.backend.teardown()
    except Exception as teardown_error:
        log.error("backend teardown raised %r", teardown_error)
    _call_each("on_teardown", dispatcher.handlers("on_teardown"), driver)
    saver.close()


def _call_each(hook: str, handlers: Sequence[Callable[..., Any]], *args: Any) -> None:
    """Call every handler of ``hook``; an error is logged and the next handler runs."""
    for handler in handlers:
        try:
            handler(*args)
        except Exception as error:
            log.error("%s handler %r raised %r", hook, handler, error)
