"""Checkpoints on disk: atomic directories, a size manifest, the ``latest`` pointer.

Layout::

    runs/<name>/checkpoints/
        step_000100/          backend/ (the backend's native format) + baton.json
        .tmp-step_000200/     a save in progress (never loaded)
        latest -> step_000100 the newest complete checkpoint

A checkpoint is written under a temporary name and renamed when complete; its
``baton.json`` lists every backend file with its size, so a truncated or partly
deleted checkpoint is detected and skipped instead of loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("baton")

META_FILE = "baton.json"
BACKEND_DIR = "backend"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with the reason and what to do."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint directories under ``root``, oldest first (by step)."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and checkpoint_step(p) is not None
    ]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def manifest(directory: Path) -> dict[str, int]:
    """Relative path -> size of every file below ``directory``."""
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_meta(path: Path) -> dict[str, Any]:
    """Validate a checkpoint directory and return its ``baton.json``.

    Raises ``CheckpointError`` naming what is wrong: no metadata (half-written),
    unreadable metadata, or backend files missing or of the wrong size (truncated).
    """
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: no {META_FILE}; the save did not finish")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: {META_FILE} is unreadable ({error})") from error
    expected: dict[str, int] = meta.get("files", {})
    backend_dir = path / BACKEND_DIR
    for rel, size in expected.items():
        file = backend_dir / rel
        if not file.is_file():
            raise CheckpointError(f"{path}: backend file {rel} is missing")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{path}: backend file {rel} has {actual} bytes, expected {size} (truncated)"
            )
    return meta


def resumable(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Complete checkpoints under ``root``, newest first; broken ones are reported and skipped."""
    good: list[tuple[Path, dict[str, Any]]] = []
    for path in reversed(list_checkpoints(root)):
        try:
            good.append((path, read_meta(path)))
        except CheckpointError as error:
            log.warning("skipping checkpoint: %s", error)
    return good


def update_latest(root: Path, target: Path) -> None:
    """Point ``root/latest`` at ``target`` atomically (a symlink swapped by rename)."""
    link = root / LATEST
    tmp = root / f"{TMP_PREFIX}{LATEST}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)


def latest(root: Path) -> Path | None:
    link = root / LATEST
    return link.resolve() if link.is_symlink() and link.resolve().is_dir() else None


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory: first renamed out of sight, so a crash mid-delete
    never leaves a half-deleted directory that looks complete."""
    trash = path.with_name(f"{TMP_PREFIX}deleting-{path.name}")
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def finalize(tmp: Path, final: Path, meta: dict[str, Any]) -> Path:
    """Complete a save: write the manifest and ``baton.json``, rename, update ``latest``."""
    meta = dict(meta)
    meta["files"] = manifest(tmp / BACKEND_DIR) if (tmp / BACKEND_DIR).exists() else {}
    write_json_atomic(tmp / META_FILE, meta)
    if final.exists():
        remove_checkpoint(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    update_latest(final.parent, final)
    return final


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
