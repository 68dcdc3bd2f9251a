"""Errors baton reports to people as one short message, with the exit status ``baton``
returns for them (no traceback unless ``BATON_DEBUG=1``).

- ``UsageError`` (exit 2): the command, recipe or settings ask for something baton
  will not do (a negative step count, a missing ``--resume`` path, checkpoints that
  would be replaced); the message names the fix.
- ``RecipeError`` (exit 2): a recipe file that cannot be used (missing, no ``recipe``
  function, a parameter without a type); a ``UsageError``.
- ``RunError`` (exit 1): the run could not go on (its run directory is in use, no
  checkpoint can be loaded).

Example::

    from baton.core.errors import UsageError

    raise UsageError("batch_size must be >= 1, got 0; pass --batch-size 8")
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BatonError(Exception):
    """A problem reported to the user as its message alone."""

    exit_status = 1


class UsageError(BatonError, ValueError):
    """Bad input: the message names the setting and how to fix it (exit status 2)."""

    exit_status = 2


class RunError(BatonError, RuntimeError):
    """The run cannot go on; the message says why and what to do (exit status 1)."""

    exit_status = 1


class RecipeError(UsageError):
    """The recipe file cannot be used; the message says why and what to change."""


class DataRequired(RecipeError):
    """A recipe that trains on real data was given none; the message names the flags
    (``baton.core.cli.dry_run.require_data`` raises it)."""


class ExportError(UsageError):
    """A checkpoint that cannot be exported in the asked format (``baton export``); the
    message names the problem and the fix (exit status 2)."""


def did_you_mean(name: str, choices: Iterable[str]) -> str | None:
    """The one choice closest to a mistyped ``name``, if any is close (``difflib``).

    >>> did_you_mean("emma", ["ema", "freeze", "gc"])
    'ema'
    >>> did_you_mean("max_step", ["lr", "max_steps"])
    'max_steps'
    """
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None
