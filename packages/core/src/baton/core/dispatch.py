"""Hook dispatch: decided once per run, free for hooks nobody overrides."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from baton.core.callback import Callback
from baton.core.hooks import EXIT_HOOKS, HOOKS

log = logging.getLogger("baton")


def overrides(callback: Callback, hook: str) -> bool:
    """True when ``callback``'s class replaces the base no-op for ``hook``."""
    return getattr(type(callback), hook) is not getattr(Callback, hook)


def in_dispatch_order(callbacks: Iterable[Callback]) -> list[Callback]:
    """Sort by ``priority`` (lower first), keeping list order among equals."""
    return sorted(callbacks, key=lambda cb: cb.priority)


class Dispatcher:
    """Per hook, the bound methods of the callbacks that override it, in call order."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = in_dispatch_order(callbacks)
        #: per hook, the handlers to call in order (read once per call by the loop)
        self.table: dict[str, tuple[Callable[..., Any], ...]] = {}
        for hook in HOOKS:
            handlers = [getattr(cb, hook) for cb in self.callbacks if overrides(cb, hook)]
            if hook in EXIT_HOOKS:
                handlers.reverse()
            self.table[hook] = tuple(handlers)

    def handlers(self, hook: str) -> tuple[Callable[..., Any], ...]:
        return self.table[hook]

    def __call__(self, hook: str, *args: Any) -> None:
        for handler in self.table[hook]:
            handler(*args)

    def call_each_guarded(self, hook: str, *args: Any) -> None:
        """Call every handler of ``hook``; an error is logged and the next handler runs
        (the end of a run: one failure must not keep the next from running)."""
        for handler in self.table[hook]:
            try:
                handler(*args)
            except Exception as error:
                log.error("%s handler %r raised %r", hook, handler, error)
