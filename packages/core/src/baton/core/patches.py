"""Backend fixes as callbacks: a version range, a condition, a phase and an undo.

A patch changes a backend (an attribute, an environment variable, a config field)
in the hook that fits its phase, through a ``PatchRecorder`` that undoes every change
in reverse order on teardown, also when training raised. Patches register per
backend; the driver attaches the applicable ones to every run of that backend and
reports which applied and why the others were skipped.

Example::

    from baton.core.patches import Patch, register_patch

    @register_patch
    class QuietTokenizers(Patch):
        '''Silence the tokenizers fork warning.'''

        name = "quiet_tokenizers"
        backend = "torchtitan"
        versions = ">=0.3,<0.4"
        phase = "configure"

        def apply(self, driver, recorder):
            recorder.setenv("TOKENIZERS_PARALLELISM", "false")

Selection: ``BATON_PATCHES=none``, ``all`` (the default), a comma list of names, or
``all,-name`` to drop one; a recipe passes the same string as ``patches=``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from baton.core.callback import PATCH_PRIORITY, Callback
from baton.core.registry import Registry

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

PHASES: dict[str, str] = {
    "configure": "on_configure",
    "setup": "on_setup",
    "train_start": "on_train_start",
    "train_end": "on_train_end",
}

_MISSING = object()


class PatchRecorder:
    """Makes changes and remembers how to revert them, last-in first-out."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []

    def __len__(self) -> int:
        return len(self._undo)

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)``; undo restores the old value or deletes it."""
        old = obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        if old is _MISSING and not hasattr(obj, "__dict__"):
            old = getattr(obj, name, _MISSING)
        setattr(obj, name, value)

        def undo() -> None:
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

        self._undo.append((f"setattr {getattr(obj, '__name__', type(obj).__name__)}.{name}", undo))

    def setitem(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        """``mapping[key] = value``; undo restores or removes the key."""
        old = mapping.get(key, _MISSING)
        mapping[key] = value

        def undo() -> None:
            if old is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = old

        self._undo.append((f"setitem {key!r}", undo))

    def setenv(self, key: str, value: str | None) -> None:
        """Set (or with ``None`` remove) an environment variable; undo restores it."""
        old = os.environ.get(key)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

        def undo() -> None:
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

        self._undo.append((f"setenv {key}", undo))

    def on_undo(self, description: str, undo: Callable[[], None]) -> None:
        """Register any other revert action (for changes made by other means)."""
        self._undo.append((description, undo))

    def undo(self) -> list[str]:
        """Revert everything, newest first; returns the failures (it never stops early)."""
        failures: list[str] = []
        while self._undo:
            description, action = self._undo.pop()
            try:
                action()
            except Exception as error:  # keep reverting the rest
                failures.append(f"{description}: {error!r}")
        return failures


class Patch(Callback):
    """A backend fix with an applicability rule. Subclasses set the class attributes
    and implement ``apply``; ``condition`` optionally narrows where it applies."""

    name: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    #: PEP 440 specifiers over the backend's installed version, e.g. ``">=0.3,<0.4"``
    versions: ClassVar[str] = ""
    phase: ClassVar[str] = "configure"
    priority: ClassVar[int] = PATCH_PRIORITY

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.phase not in PHASES:
            raise ValueError(
                f"patch {cls.__name__}: phase {cls.phase!r} is not one of {list(PHASES)}"
            )
        if cls.versions:
            try:
                SpecifierSet(cls.versions)
            except InvalidSpecifier as error:
                raise ValueError(
                    f"patch {cls.__name__}: bad version range {cls.versions!r}"
                ) from error
        # Bind the phase's hook so override detection dispatches exactly that one.
        setattr(cls, PHASES[cls.phase], Patch._apply_in_phase)

    def __init__(self) -> None:
        self.recorder = PatchRecorder()
        self.applied = False

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        """Whether the run needs this patch (``(False, why)`` to explain a skip)."""
        return True

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        raise NotImplementedError

    def _apply_in_phase(self, driver: DriverView) -> None:
        self.applied = True
        self.apply(driver, self.recorder)

    def on_teardown(self, driver: DriverView) -> None:
        failures = self.recorder.undo()
        if failures:
            import logging

            logging.getLogger("baton").warning("patch %s: undo failed for %s", self.name, failures)

    def __repr__(self) -> str:
        return f"Patch({self.name})"


PATCHES: Registry[type[Patch]] = Registry("patch")


def register_patch[P: type[Patch]](cls: P) -> P:
    """Class decorator: add a patch to the registry under its ``name``."""
    if not cls.name or not cls.backend:
        raise ValueError(f"patch {cls.__name__} needs a name and a backend")
    PATCHES.add(cls.name, cls)
    return cls


def patches_for(backend_name: str) -> list[type[Patch]]:
    return [cls for _, cls in PATCHES.items() if cls.backend == backend_name]


@dataclass(frozen=True)
class PatchDecision:
    name: str
    applied: bool
    reason: str


def version_matches(spec: str, installed: str) -> bool:
    """Whether ``installed`` lies in ``spec`` (pre-releases and dev builds count)."""
    if not spec:
        return True
    try:
        return SpecifierSet(spec).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


def parse_selection(selection: str | None, available: list[str]) -> tuple[set[str], str]:
    """Turn ``none`` / ``all`` / ``a,b`` / ``all,-a`` into the chosen set of names."""
    text = (selection if selection is not None else os.environ.get("BATON_PATCHES", "all")).strip()
    source = "recipe" if selection is not None else "BATON_PATCHES"
    if text in ("", "all"):
        return set(available), source
    if text == "none":
        return set(), source
    items = [i.strip() for i in text.split(",") if i.strip()]
    # a list that only removes ("-a,-b") starts from every patch
    chosen: set[str] = set(available) if items and items[0].startswith("-") else set()
    for item in items:
        name = item.lstrip("-+")
        if name == "all":
            chosen |= set(available)
            continue
        if name not in available:
            raise ValueError(
                f"unknown patch {name!r} in {source}={text!r}; patches for this backend: "
                f"{', '.join(available) or '(none)'}; use 'all', 'none' or a comma list"
            )
        if item.startswith("-"):
            chosen.discard(name)
        else:
            chosen.add(name)
    return chosen, source


def select_patches(
    backend: Backend, selection: str | None = None
) -> tuple[list[Patch], list[PatchDecision]]:
    """Instantiate the registered patches that apply to ``backend``; explain each decision."""
    candidates = patches_for(backend.name)
    chosen, source = parse_selection(selection, [c.name for c in candidates])
    installed = backend.version
    patches: list[Patch] = []
    decisions: list[PatchDecision] = []
    for cls in candidates:
        if cls.name not in chosen:
            decisions.append(PatchDecision(cls.name, False, f"deselected by {source}"))
            continue
        if not version_matches(cls.versions, installed):
            decisions.append(
                PatchDecision(
                    cls.name, False, f"{backend.name} {installed} is outside {cls.versions}"
                )
            )
            continue
        patch = cls()
        verdict = patch.condition(backend)
        ok, why = verdict if isinstance(verdict, tuple) else (verdict, "")
        if not ok:
            decisions.append(PatchDecision(cls.name, False, why or "condition not met"))
            continue
        patches.append(patch)
        reason = f"{backend.name} {installed} in {cls.versions or 'any version'}"
        decisions.append(PatchDecision(cls.name, True, f"{reason}; {why}" if why else reason))
    return patches, decisions
