"""Framework messages a backend hides from baton's console, each named with its reason.

A training framework talks to its own users: it warns that an optional accelerator
library is missing, that a class it still ships is deprecated, that a default it fills
in could be passed explicitly. Under baton those notes concern baton's code, not the
person running the recipe. A backend lists the ones it knows are irrelevant as
``Quiet`` entries of a ``QuietPatch``: each matches one message exactly (its start)
and one warning category or one logger, never a whole logger or category. Everything
else, a real misconfiguration included, still shows::

    from baton.core.patches import register_patch
    from baton.core.quiet import Quiet, QuietPatch

    @register_patch
    class MegatronQuiet(QuietPatch):
        '''Hide Megatron-Core's notes that concern baton's code, not the run.'''

        name = "megatron_quiet"
        backend = "megatron"
        distribution = "megatron-core"
        versions = ">=0.19,<0.20"
        quiet = (
            Quiet("GPTModel IS DEPRECATED", logger="megatron.core.models.gpt.gpt_model",
                  reason="baton builds GPTModel; the migration is baton's to make"),
        )

The patch installs its filters when a run configures and removes them on teardown
(``baton patches --backend megatron`` lists it; ``BATON_PATCHES=all,-megatron_quiet``
shows everything again). Frameworks also speak while a recipe imports them, before
any run exists: ``quiet_imports`` (called by ``baton run`` and ``baton eval`` before
the recipe loads) installs the selected quiet patches' filters for the whole process.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from baton.core.patches import PATCHES, Patch, PatchRecorder, parse_selection, version_matches

if TYPE_CHECKING:
    from baton.core.driver_view import DriverView


@dataclass(frozen=True)
class Quiet:
    """One framework message to hide: a warning (``category``) or a log record (``logger``).

    ``message`` is the message's exact beginning; ``module`` (a regex over the warning's
    module, warnings only) narrows where it comes from; ``reason`` says why a baton user
    does not need it (it stays next to the filter for whoever looks for a hidden message).
    """

    message: str
    reason: str
    category: type[Warning] | None = None
    logger: str | None = None
    module: str = ""

    def __post_init__(self) -> None:
        if (self.category is None) == (self.logger is None):
            raise ValueError(f"Quiet({self.message!r}): give exactly one of category or logger")
        if not self.reason:
            raise ValueError(f"Quiet({self.message!r}): say why it is hidden (reason=...)")


class QuietRecords(logging.Filter):
    """Drops one logger's records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def _warning_entry(quiet: Quiet) -> tuple[object, ...]:
    """The ``warnings.filters`` entry ``filterwarnings`` makes for ``quiet``."""
    module = re.compile(quiet.module) if quiet.module else None
    return ("ignore", re.compile(re.escape(quiet.message), re.I), quiet.category, module, 0)


def _remove_warning_filter(entry: tuple[object, ...]) -> None:
    kept = [f for f in warnings.filters if f != entry]
    warnings.resetwarnings()  # tells the warnings machinery its filters changed
    cast("list[Any]", warnings.filters)[:] = kept  # a list, typed as a sequence


def _child_filter(quiet: Quiet) -> str | None:
    """The ``PYTHONWARNINGS`` item for processes the run spawns (builtin categories only:
    the child resolves the name before anything is imported; a message with the list's
    separators, ``:`` or ``,``, cannot be written there)."""
    category = quiet.category
    if category is None or category.__module__ != "builtins" or {":", ","} & set(quiet.message):
        return None
    return f"ignore:{quiet.message}:{category.__name__}"


def install_quiet(quiets: tuple[Quiet, ...], recorder: PatchRecorder | None = None) -> None:
    """Install the filters for ``quiets``; with a ``recorder`` each one is undone on its
    undo (filters already present, e.g. from ``quiet_imports``, are left alone)."""
    _filter_warnings([q for q in quiets if q.category is not None], recorder)
    by_logger: dict[str, list[str]] = {}
    for quiet in quiets:
        if quiet.logger is not None:
            by_logger.setdefault(quiet.logger, []).append(quiet.message)
    for name, prefixes in by_logger.items():
        _filter_records(logging.getLogger(name), prefixes, recorder)


def _filter_warnings(quiets: list[Quiet], recorder: PatchRecorder | None) -> None:
    for quiet in quiets:
        entry = _warning_entry(quiet)
        if entry in warnings.filters:
            continue
        warnings.filterwarnings(
            "ignore", re.escape(quiet.message), quiet.category or Warning, quiet.module
        )
        if recorder is not None:
            recorder.on_undo(f"warning filter {quiet.message!r}", _remover(entry))
    children = [c for c in map(_child_filter, quiets) if c]
    current = os.environ.get("PYTHONWARNINGS", "")
    missing = [c for c in children if c not in current.split(",")]
    if missing and recorder is not None:  # processes the run spawns do not run baton's CLI
        recorder.setenv("PYTHONWARNINGS", ",".join([i for i in [current, *missing] if i]))


def _remover(entry: tuple[object, ...]) -> Callable[[], None]:
    return lambda: _remove_warning_filter(entry)


def _filter_records(
    logger: logging.Logger, prefixes: list[str], recorder: PatchRecorder | None
) -> None:
    wanted = tuple(p for p in prefixes if not _already_filtered(logger, p))
    if not wanted:
        return
    record_filter = QuietRecords(wanted)
    logger.addFilter(record_filter)
    if recorder is not None:
        recorder.on_undo(f"log filter on {logger.name}", lambda: logger.removeFilter(record_filter))


def _already_filtered(logger: logging.Logger, prefix: str) -> bool:
    return any(isinstance(f, QuietRecords) and prefix in f.prefixes for f in logger.filters)


class QuietPatch(Patch):
    """A patch that hides the framework messages listed in ``quiet`` for the run.

    ``distribution`` names the framework's package, so that ``quiet_imports`` can check
    ``versions`` before any backend exists.
    """

    phase: ClassVar[str] = "configure"
    distribution: ClassVar[str] = ""
    quiet: ClassVar[tuple[Quiet, ...]] = ()

    @classmethod
    def early_condition(cls) -> bool:
        """Whether ``quiet_imports`` installs these filters (before torch or jax load:
        decide without importing them); ``condition`` decides for the run."""
        return True

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        install_quiet(self.quiet, recorder)


def no_nvidia_device() -> bool:
    """Whether this machine shows no NVIDIA device node (decided without importing torch)."""
    from pathlib import Path

    return not any(Path("/dev").glob("nvidia[0-9]*"))


def quiet_imports() -> None:
    """Install, for this process, the filters of every quiet patch that applies to the
    installed frameworks (and that ``BATON_PATCHES`` selects), before a recipe imports
    them. ``baton run``, ``baton eval`` and ``baton submit`` call it; a program that drives
    baton from Python gets the filters when its run configures."""
    from baton.core.backend import installed_version
    from baton.core.registry import load_plugins

    load_plugins()
    quiet_patches = [cls for _, cls in PATCHES.items() if issubclass(cls, QuietPatch)]
    try:
        chosen, _ = parse_selection(None, [cls.name for _, cls in PATCHES.items()])
    except ValueError:  # the run itself reports a bad selection
        return
    for cls in quiet_patches:
        installed = installed_version(cls.distribution) if cls.distribution else None
        if cls.name not in chosen or not installed or not version_matches(cls.versions, installed):
            continue
        if cls.early_condition():
            install_quiet(cls.quiet)
