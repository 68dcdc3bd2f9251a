"""Core's record of a backend's checkpoint, and the one check a resume makes of it.

Beside its native files, a checkpoint depends on facts only the backend knows: the
parallel layout it was written on, where its data stood (in one unit for every
backend: global samples consumed) and which data it was (a fingerprint). A backend
reports them through ``RecordsCheckpoint``; ``CheckpointSaver`` records them in
``baton.json`` under ``"checkpoint"``, and before the backend loads anything
``check_record`` compares them with this run's and refuses a mismatch, naming both
sides::

    facts = backend.checkpoint_facts()
    # CheckpointFacts(layout={"tp": 2, "pp": 1}, samples=800, data="3f2a...")
    meta["checkpoint"] = facts.to_json()
    ...
    check_record(backend, path, meta)
    # CheckpointMismatch: checkpoint runs/x/checkpoints/step_000100 cannot be loaded here:
    #   layout: checkpoint has tp=2, pp=1; this run has tp=1, pp=1: <why, and the fix>

A layout that differs is not refused by itself: the backend says whether its framework
reshards it (``layout_refusal``). Checkpoints written before ``baton.json`` held these
facts kept them in a backend's side file; ``legacy_facts`` reads it.

A backend that got a name of its own after its checkpoints were recorded under another
(the ``lightning`` backend's, once recorded as ``fabric``) claims them by what their
native files hold (``ClaimsRenamedCheckpoints``); ``as_written_by`` then reads the
recorded name as this backend's for the checks that compare names::

    meta = as_written_by(backend, path, meta)   # {"backend": {"name": "lightning", ...}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from baton.core.checkpointing import BACKEND_DIR, CheckpointMismatch

if TYPE_CHECKING:
    from baton.core.backend import Backend

#: the key of the record in ``baton.json``
RECORD_KEY = "checkpoint"


@dataclass(frozen=True)
class CheckpointFacts:
    """What a checkpoint depends on beside its native files.

    Args:
        layout: the parallel layout it is written on, JSON-ready (``{"tp": 2, "pp": 1}``).
        samples: the data position: training samples consumed, over every rank together.
        data: the training data's fingerprint (``""``: the backend cannot tell).
    """

    layout: Mapping[str, Any] = field(default_factory=dict[str, Any])
    samples: int = 0
    data: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"layout": dict(self.layout), "samples": self.samples, "data": self.data}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CheckpointFacts:
        layout = cast(Mapping[str, Any], value.get("layout") or {})
        return cls(dict(layout), int(value.get("samples", 0)), str(value.get("data") or ""))


@runtime_checkable
class RecordsCheckpoint(Protocol):
    """A backend's checkpoint facts, and whether a saved layout loads on this run's.

    ``layout_refusal(saved)`` is asked only when the saved layout differs from this
    run's, before ``load``: ``None`` when the framework reshards it (the backend may
    remember how to load it, e.g. without a data position that cannot move), or why it
    cannot load here and what to do. ``legacy_facts(directory)`` reads the facts of a
    checkpoint written before ``baton.json`` recorded them from the backend's old side
    file in ``directory`` (the checkpoint's ``backend/``), ``None`` when there is none.
    """

    def checkpoint_facts(self) -> CheckpointFacts: ...

    def layout_refusal(self, saved: Mapping[str, Any]) -> str | None: ...

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None: ...


@runtime_checkable
class ClaimsRenamedCheckpoints(Protocol):
    """A backend whose checkpoints an older version recorded under another backend name.

    ``claims_checkpoint(saved_name, directory)``: whether the checkpoint recorded as
    written by ``saved_name``, its native files in ``directory`` (the checkpoint's
    ``backend/``), is this backend's own, told by what those files hold and never by the
    name alone (the ``lightning`` backend claims a ``fabric`` checkpoint that holds its
    loop's state, and no other).
    """

    def claims_checkpoint(self, saved_name: str, directory: Path) -> bool: ...


def as_written_by(backend: Backend, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (the ``baton.json`` of the checkpoint at ``path``) with its recorded
    backend name read as ``backend``'s where ``backend`` claims the checkpoint
    (``ClaimsRenamedCheckpoints``); otherwise ``meta`` itself."""
    saved = cast(dict[str, Any], meta.get("backend") or {})
    name = saved.get("name")
    if name is None or name == backend.name or not isinstance(backend, ClaimsRenamedCheckpoints):
        return meta
    if not backend.claims_checkpoint(str(name), path / BACKEND_DIR):
        return meta
    return {**meta, "backend": {**saved, "name": backend.name, "recorded_name": name}}


def record(backend: object) -> dict[str, Any] | None:
    """The ``baton.json`` entry of ``backend``'s facts (``None``: it reports none)."""
    if not isinstance(backend, RecordsCheckpoint):
        return None
    return backend.checkpoint_facts().to_json()


def saved_facts(
    backend: RecordsCheckpoint, path: Path, meta: Mapping[str, Any]
) -> CheckpointFacts | None:
    """The facts the checkpoint at ``path`` was written with: its ``baton.json``
    record, else the backend's side file of an older checkpoint."""
    if meta.get(RECORD_KEY) is not None:
        return CheckpointFacts.from_json(cast(Mapping[str, Any], meta[RECORD_KEY]))
    return backend.legacy_facts(path / BACKEND_DIR)


def show_layout(layout: Mapping[str, Any], order: Mapping[str, Any] | None = None) -> str:
    """``tp=2, pp=1`` (``(none)`` for an empty layout), keys in ``order``'s order first
    (``baton.json`` sorts its keys; the backend's own order reads better).

    >>> show_layout({"pp": 1, "tp": 2}, order={"tp": 1, "pp": 1})
    'tp=2, pp=1'
    """
    keys = [k for k in (order or {}) if k in layout] + [k for k in layout if k not in (order or {})]
    return ", ".join(f"{key}={layout[key]}" for key in keys) or "(none)"


def check_record(backend: object, path: Path, meta: Mapping[str, Any]) -> None:
    """Refuse, before anything is loaded, a checkpoint trained on other data or saved on
    a layout this run cannot load (``CheckpointMismatch`` naming both sides)."""
    if not isinstance(backend, RecordsCheckpoint):
        return
    saved = saved_facts(backend, path, meta)
    if saved is None:
        return
    current = backend.checkpoint_facts()
    problems: list[str] = []
    if saved.data and current.data and saved.data != current.data:
        problems.append(
            f"data: checkpoint has fingerprint {saved.data[:16]}; this run has "
            f"{current.data[:16]}: resume with the data and tokenizer it was trained on"
        )
    if dict(saved.layout) != dict(current.layout):
        why = backend.layout_refusal(saved.layout)
        if why is not None:
            problems.append(
                f"layout: checkpoint has {show_layout(saved.layout, current.layout)}; this run has "
                f"{show_layout(current.layout)}: {why}"
            )
    if problems:
        raise CheckpointMismatch(
            f"checkpoint {path} cannot be loaded by this run:\n  " + "\n  ".join(problems)
        )
