"""Whether a checkpoint can continue this run, and how it loads: one judge, asked
twice.

Before anything is built, ``judge_recipe`` compares the checkpoint's ``baton.json`` with
the recipe: the same run (backend and recipe: another experiment's directory is
refused), the same model architecture, the same shape settings. After ``setup`` and
before a backend reads anything, ``judge`` compares it with the built run: the backend's ``describe()`` facts (a different setup), then the
checkpoint record (``baton.core.checkpoint_record``: the data's fingerprint and the
parallel layout). A layout that differs is the backend's to judge through
``plan_load``; the plan it returns is what ``load`` is handed::

    plan = judge(backend, path, meta)        # CheckpointMismatch naming both sides
    backend.load(path / BACKEND_DIR, plan)

What a resume may change beside these (``--allow-changed``) is the settings policy of
``baton.core.checkpoints.settings``.

A backend that got a name of its own after its checkpoints were recorded under another
(the ``lightning`` backend's, once recorded as ``fabric``) claims them by what their
native files hold (``Backend.claims_checkpoint``); ``as_written_by`` then reads the
recorded name as this backend's for every check that compares names.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from baton.core.backend import Backend
from baton.core.checkpoint_record import (
    LOAD_ALL,
    RECORD_KEY,
    CheckpointFacts,
    LoadPlan,
    show_layout,
)
from baton.core.checkpoints.files import BACKEND_DIR, CheckpointMismatch
from baton.core.checkpoints.settings import check_same_run, check_same_shape
from baton.core.model.spec import check_same_architecture

log = logging.getLogger("baton")


def as_written_by(backend: Backend, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (the ``baton.json`` of the checkpoint at ``path``) with its recorded
    backend name read as ``backend``'s where ``backend`` claims the checkpoint;
    otherwise ``meta`` itself."""
    saved = cast(dict[str, Any], meta.get("backend") or {})
    name = saved.get("name")
    if name is None or name == backend.name:
        return meta
    if not backend.claims_checkpoint(str(name), path / BACKEND_DIR):
        return meta
    return {**meta, "backend": {**saved, "name": backend.name, "recorded_name": name}}


def saved_facts(backend: Backend, path: Path, meta: Mapping[str, Any]) -> CheckpointFacts | None:
    """The facts the checkpoint at ``path`` was written with: its ``baton.json``
    record, else the backend's side file of an older checkpoint."""
    if meta.get(RECORD_KEY) is not None:
        return CheckpointFacts.from_json(cast(Mapping[str, Any], meta[RECORD_KEY]))
    return backend.legacy_facts(path / BACKEND_DIR)


def judge_recipe(
    path: Path, meta: Mapping[str, Any], *, backend: str, settings: Mapping[str, Any]
) -> None:
    """Before anything is built: refuse the checkpoint at ``path`` (its ``baton.json`` is
    ``meta``) when another run wrote it (backend ``backend``'s recipe with ``settings``),
    its model's architecture differs, or a shape setting does; identity first, then the
    model, then the shapes (``UsageError`` naming the difference and the fix)."""
    check_same_run(meta, backend=backend, settings=settings, checkpoint=path)
    saved = cast(Mapping[str, Any], meta.get("settings", {}))
    check_same_architecture(
        saved.get("model_spec"), settings.get("model_spec"), what=f"checkpoint {path}"
    )
    check_same_shape(saved, settings, checkpoint=path)


def judge(backend: Backend, path: Path, meta: dict[str, Any]) -> LoadPlan:
    """How the checkpoint at ``path`` (its ``baton.json`` is ``meta``) loads into this
    run; ``CheckpointMismatch`` when it was written by another setup, trained on other
    data, or saved on a layout this run cannot load, naming each difference."""
    meta = as_written_by(backend, path, meta)
    saved: dict[str, Any] = dict(meta.get("backend", {}))
    former = saved.pop("recorded_name", None)
    if former is not None:
        log.info(
            "checkpoint %s recorded backend %r, this backend's former name: resuming it as %r",
            path,
            former,
            backend.name,
        )
    current = {"name": backend.name, **backend.describe()}
    diffs = [
        line
        for key, value in current.items()
        if key in saved and saved[key] != value
        for line in differences(key, saved[key], value)
    ]
    if diffs:
        raise CheckpointMismatch(
            f"checkpoint {path} was written by a different setup:\n  "
            + "\n  ".join(diffs)
            + "\nresume with the settings it was saved with, or start a new run_dir"
        )
    return record_plan(backend, path, meta)


def record_plan(backend: Backend, path: Path, meta: Mapping[str, Any]) -> LoadPlan:
    """The checkpoint record's half of ``judge``: the data's fingerprint, then the layout
    (the backend's plan)."""
    saved = saved_facts(backend, path, meta)
    if saved is None:
        return LOAD_ALL
    current = backend.checkpoint_facts()
    problems: list[str] = []
    if saved.data and current.data and saved.data != current.data:
        problems.append(
            f"data: checkpoint has fingerprint {saved.data[:16]}; this run has "
            f"{current.data[:16]}: resume with the data and tokenizer it was trained on"
        )
    plan = LOAD_ALL
    if dict(saved.layout) != dict(current.layout):
        plan = backend.plan_load(saved.layout)
        if plan.refusal is not None:
            problems.append(
                f"layout: checkpoint has {show_layout(saved.layout, current.layout)}; this run has "
                f"{show_layout(current.layout)}: {plan.refusal}"
            )
    if problems:
        raise CheckpointMismatch(
            f"checkpoint {path} cannot be loaded by this run:\n  " + "\n  ".join(problems)
        )
    if plan.note:
        log.warning("%s", plan.note)
    return plan


def differences(name: str, saved: Any, current: Any) -> list[str]:
    """Where two recorded values differ, field by field for tables.

    >>> differences("model", {"d_model": 128}, {"d_model": 64})
    ['model.d_model: checkpoint has 128, this run has 64']
    """
    if isinstance(saved, dict) and isinstance(current, dict):
        old = cast(dict[str, Any], saved)
        new = cast(dict[str, Any], current)
        return [
            line
            for key in sorted(old.keys() | new.keys(), key=str)
            if old.get(key) != new.get(key)
            for line in differences(f"{name}.{key}", old.get(key), new.get(key))
        ]
    return [f"{name}: checkpoint has {saved!r}, this run has {current!r}"]
