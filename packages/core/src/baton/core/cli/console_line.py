"""The console line's keys, chosen per run: ``--console-keys`` on any recipe.

A callback that prints a console line (the standard ``CompositeLogger`` with its
console sink) shows a fixed set of keys; a custom callback's or a model's own metrics
(``metrics.jsonl`` has them all) join the line by name::

    baton run recipes/quickstart.py --console-keys +my/metric     # added to the recipe's
    baton run recipes/quickstart.py --console-keys loss,lr,my/metric   # exactly these

In code, ``standard_callbacks(console_keys=(*CONSOLE_KEYS, "my/metric"))``. A key
``a|b`` shows ``a`` when it was logged, else ``b``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from baton.core.errors import UsageError


@runtime_checkable
class ShowsConsoleLine(Protocol):
    """A callback that prints a console line of chosen metric keys."""

    def console_keys(self) -> list[str] | None:
        """The keys shown (``[]``: every metric; ``None``: this callback prints no
        console line)."""
        ...

    def show_console_keys(self, keys: Sequence[str]) -> None:
        """Show these keys from now on."""
        ...


def chosen_keys(current: Sequence[str], text: str) -> list[str]:
    """``"a,b"`` -> exactly those; ``"+a,+b"`` -> ``current`` and those.

    >>> chosen_keys(["loss"], "+my/metric")
    ['loss', 'my/metric']
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError("--console-keys needs keys: 'loss,lr' (exactly) or '+my/metric' (added)")
    added = [item[1:] for item in items if item.startswith("+")]
    if added and len(added) != len(items):
        raise UsageError(
            f"--console-keys {text}: mix of '+key' and 'key'; write only '+key's (added to "
            "the recipe's line) or only keys (the whole line)"
        )
    if added:
        return [*current, *(key for key in added if key not in current)]
    return items


def apply_console_keys(callbacks: Sequence[object], text: str) -> None:
    """Set ``--console-keys`` on every callback that prints a console line."""
    lines = [cb for cb in callbacks if isinstance(cb, ShowsConsoleLine)]
    shown = [(cb, keys) for cb in lines if (keys := cb.console_keys()) is not None]
    if not shown:
        raise UsageError(
            "--console-keys: this run prints no console line; add one with "
            "--callback logger:sinks=[jsonl,console]"
        )
    for callback, keys in shown:
        if not keys and text.lstrip().startswith("+"):
            continue  # a line of every metric already shows the added ones
        callback.show_console_keys(chosen_keys(keys, text))
