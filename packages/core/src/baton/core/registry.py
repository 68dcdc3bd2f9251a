"""Name -> component registries for callbacks, backends, patches and reward functions.

Packages register their components by decorating them; the CLI and config files
refer to components by name. Installed baton packages announce themselves through the
``baton.plugins`` entry-point group and are imported on the first lookup, so a name
is found without the caller importing anything first.

Example::

    from baton.core import Callback, CALLBACKS

    @CALLBACKS.register("print_loss")
    class PrintLoss(Callback):
        '''Print the loss on every log step.'''

    CALLBACKS.get("print_loss")  # -> PrintLoss

    @register_reward("short")
    def short(prompts, completions, completion_ids, **columns):
        '''1.0 for a completion of at most 8 tokens.'''
        return [1.0 if len(ids) <= 8 else 0.0 for ids in completion_ids]

    REWARDS.get("short")  # -> short (``--reward short``)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, cast

from baton.core.errors import UsageError

log = logging.getLogger("baton")

_plugins_loaded = False


class PluginError(UsageError):
    """An installed plugin whose module fails to import; the message names the plugin,
    its distribution and the error (exit status 2)."""


def load_plugins() -> None:
    """Import every module announced under the ``baton.plugins`` entry-point group, once.

    Plugin modules register components at import; they keep heavy imports (torch,
    jax, a backend's own package) inside functions, so this stays cheap. A plugin that
    fails to import is a ``PluginError`` (its components would otherwise be missing
    without a word), raised again on every lookup until it imports.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    for ep in sorted(entry_points(group="baton.plugins"), key=lambda e: e.name):
        try:
            import_module(ep.value)
        except Exception as error:
            dist = ep.dist.name if ep.dist is not None else None
            owner = f" (distribution {dist})" if dist else ""
            raise PluginError(
                f"baton plugin {ep.name!r}{owner} failed to import {ep.value}: "
                f"{type(error).__name__}: {error}; fix or install what it needs"
                + (f", or uninstall it (pip uninstall {dist})" if dist else "")
            ) from error
    _plugins_loaded = True


class UnknownNameError(KeyError):
    """A name that no component was registered under; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry[T]:
    """A name -> component table with a helpful error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        #: a component, or a lazy ``"package.module:Attr"`` not imported yet
        self._items: dict[str, T | str] = {}
        self._summaries: dict[str, str] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` (defaults to the object's ``name``)."""

        def decorate(obj: T) -> T:
            key: str = name or getattr(obj, "name", None) or cast(Any, obj).__name__
            existing = self._items.get(key)
            if existing is not None and existing is not obj and not isinstance(existing, str):
                raise ValueError(f"{self.kind} name {key!r} is already registered by {existing!r}")
            self._items[key] = obj
            return obj

        return decorate

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def add_lazy(self, name: str, target: str, summary: str = "") -> None:
        """Register ``"package.module:Attr"``, imported on first ``get`` (keeps imports cheap).

        ``summary`` is the one-line description listings show without importing it.
        """
        if name not in self._items:
            self._items[name] = target
            self._summaries[name] = summary

    def summary(self, name: str) -> tuple[str, str]:
        """``(where, one-line doc)`` of an entry, without importing a lazy one."""
        load_plugins()
        item = self._items[name]
        if isinstance(item, str):
            return item, self._summaries.get(name, "")
        doc = (getattr(item, "__doc__", None) or "").strip()
        where = f"{getattr(item, '__module__', '')}:{getattr(item, '__qualname__', item)}"
        return where, doc.splitlines()[0] if doc else ""

    def _resolve(self, name: str) -> T:
        item = self._items[name]
        if isinstance(item, str):
            module, _, attr = item.partition(":")
            resolved: T = getattr(import_module(module), attr)
            self._items[name] = resolved
            return resolved
        return item

    def get(self, name: str) -> T:
        if name not in self._items:
            load_plugins()
        try:
            return self._resolve(name)
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; registered {self.kind}s: {known}"
            ) from None

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        """Every entry, importing lazy ones; entries whose imports fail are left out."""
        load_plugins()
        for name in sorted(self._items):
            try:
                yield name, self._resolve(name)
            except ImportError as error:
                log.debug("%s %s not importable: %s", self.kind, name, error)

    def __contains__(self, name: object) -> bool:
        load_plugins()
        return name in self._items

    def build(self, name: str, **kwargs: Any) -> Any:
        """Look up ``name`` and call it with ``kwargs`` (for classes and factories)."""
        factory = self.get(name)
        return factory(**kwargs)  # type: ignore[operator]


CALLBACKS: Registry[type] = Registry("callback")
BACKENDS: Registry[type] = Registry("backend")
#: reward functions for GRPO, by the name ``--reward NAME`` gives (:mod:`baton.core.rewards`)
REWARDS: Registry[Callable[..., Any]] = Registry("reward")


def register_reward[F: Callable[..., Any]](name: str | None = None) -> Callable[[F], F]:
    """Decorator: ``@register_reward("name")`` makes a reward function (TRL's signature,
    see :mod:`baton.core.rewards`) ``--reward name``; the name defaults to the function's."""

    def decorate(function: F) -> F:
        REWARDS.register(name)(function)
        return function

    return decorate
