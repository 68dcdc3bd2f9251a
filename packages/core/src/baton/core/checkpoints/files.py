"""Checkpoints on disk: durable atomic directories, a checksummed manifest, ``latest``.

Layout::

    runs/<name>/checkpoints/
        step_000100/          backend/ (the backend's native format) + baton.json
                              (+ rollouts/: the rollout phase's arrays, a rollout run)
        .tmp-step_000200/     a save in progress (never loaded)
        latest -> step_000100 the newest complete checkpoint

A checkpoint is written under a temporary name, every file and directory in it is
fsynced, then it is renamed and its parent fsynced; ``latest`` is swapped the same way.
Its ``baton.json`` lists every backend file with its size and an xxh3-128 checksum
(``"files": {"model.pt": {"size": 1234, "xxh3_128": "..."}}``), and the files of
``rollouts/`` the same way under ``"rollout_files"``, so a truncated, zero-filled or
bit-flipped checkpoint is detected and skipped instead of loaded::

    meta = read_meta(path, verify="full")   # sizes and checksums ("size": sizes only)
    good, failures = scan(root)              # loadable ones newest first (latest first)
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, cast

import xxhash

from baton.core.errors import RunError, UsageError
from baton.core.options import check_verify

log = logging.getLogger("baton")

META_FILE = "baton.json"
#: a checkpoint's folder of the backend's own files (beside ``baton.json``)
BACKEND_DIR = "backend"
#: a checkpoint's folder of the rollout phase's arrays (a run that trains on rollouts)
ROLLOUTS_DIR = "rollouts"
#: the folders whose files ``baton.json`` lists with their sizes and checksums, by key
LISTED_DIRS = {"files": BACKEND_DIR, "rollout_files": ROLLOUTS_DIR}
#: a run's folder of checkpoints, inside its run directory
CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
TMP_PREFIX = ".tmp-"
HASH = "xxh3_128"
_NAME = re.compile(r"^step_(\d+)$")
_CHUNK = 1 << 22


def checkpoints_dir(run_dir: Path) -> Path:
    """Where the run in ``run_dir`` keeps its checkpoints.

    >>> checkpoints_dir(Path("runs/x")).as_posix()
    'runs/x/checkpoints'
    """
    return run_dir / CHECKPOINTS_DIR


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory whose ``checkpoints/`` holds ``checkpoint``, or ``None`` where
    the checkpoint lies elsewhere (a copied or downloaded one).

    >>> run_dir_of(Path("runs/a/checkpoints/step_000100")).as_posix()
    'runs/a'
    >>> run_dir_of(Path("downloads/step_000100")) is None
    True
    """
    parent = checkpoint.parent
    return parent.parent if parent.name == CHECKPOINTS_DIR else None


def native_dir(path: Path) -> Path:
    """The backend's own folder of the checkpoint at ``path`` (its ``BACKEND_DIR``), or
    ``path`` itself where it has none (a backend's folder given directly)."""
    return path / BACKEND_DIR if (path / BACKEND_DIR).is_dir() else path


class CheckpointError(RunError):
    """A checkpoint that cannot be used, with the reason and what to do."""


class CheckpointMismatch(CheckpointError, UsageError):
    """A sound checkpoint that this run's settings do not fit (another model size,
    backend or layout): bad input, exit status 2 like the other mismatches."""

    exit_status = 2


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


def file_digest(path: Path) -> str:
    """The xxh3-128 checksum of a file's bytes, as hex."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(directory: Path, *, checksums: bool = True) -> dict[str, dict[str, Any]]:
    """Relative path -> ``{"size": bytes, "xxh3_128": hex}`` of every file below ``directory``."""
    found: dict[str, dict[str, Any]] = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            entry: dict[str, Any] = {"size": p.stat().st_size}
            if checksums:
                entry[HASH] = file_digest(p)
            found[str(p.relative_to(directory))] = entry
    return found


def fsync_path(path: Path) -> None:
    """Flush one file or directory to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: Path) -> None:
    """fsync every file below ``directory``, then every directory bottom-up, itself last."""
    dirs: list[Path] = []
    for root, subdirs, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                fsync_path(path)
        dirs.append(Path(root))
        subdirs.sort()
    for d in reversed(dirs):
        fsync_path(d)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON durably: a fsynced temporary file renamed over ``path``, parent fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def read_meta(path: Path, verify: str = "full") -> dict[str, Any]:
    """Validate a checkpoint directory and return its ``baton.json``.

    Raises ``CheckpointError`` naming what is wrong: no metadata (half-written),
    unreadable metadata, backend files missing, of the wrong size (truncated) or, with
    ``verify="full"``, whose bytes differ from their checksum (corrupted).
    """
    check_verify(verify)
    meta_path = path / META_FILE
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist or is not a checkpoint directory")
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: no {META_FILE}; the save did not finish")
    try:
        loaded: Any = json.loads(meta_path.read_text())
        if not isinstance(loaded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: {META_FILE} is unreadable ({error})") from error
    meta = cast(dict[str, Any], loaded)
    for key, folder in LISTED_DIRS.items():
        files: dict[str, Any] = dict(meta.get(key, {}))
        _verify_files(path, folder, files, verify)
    return meta


def _verify_files(path: Path, folder: str, files: dict[str, Any], verify: str) -> None:
    """Each file ``baton.json`` lists for ``folder`` is there, of its size and (with
    ``verify="full"``) its checksum."""
    for rel, entry in files.items():
        # format 1 recorded sizes only
        expected = cast(dict[str, Any], entry) if isinstance(entry, dict) else {"size": entry}
        file = path / folder / rel
        if not file.is_file():
            raise CheckpointError(f"{path}: {folder} file {rel} is missing")
        actual = file.stat().st_size
        if actual != expected.get("size"):
            raise CheckpointError(
                f"{path}: {folder} file {rel} has {actual} bytes, expected "
                f"{expected.get('size')} (truncated)"
            )
        if verify == "full" and HASH in expected and file_digest(file) != expected[HASH]:
            raise CheckpointError(
                f"{path}: {folder} file {rel} does not match its {HASH} checksum (corrupted)"
            )


def scan(root: Path, verify: str = "full") -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """Loadable checkpoints under ``root`` and why the others are not.

    The one ``latest`` points at comes first when it is valid, then the others newest
    first; each broken one is logged as a warning and described in the second list.
    """
    good: list[tuple[Path, dict[str, Any]]] = []
    failures: list[str] = []
    for path in resume_order(root):
        try:
            good.append((path, read_meta(path, verify)))
        except CheckpointError as error:
            log.warning("skipping checkpoint: %s", error)
            failures.append(str(error))
    return good, failures


def resume_order(root: Path) -> list[Path]:
    """Checkpoint directories in the order to resume from: the one ``latest`` points at,
    then the others newest first (none of them verified)."""
    found = list(reversed(list_checkpoints(root)))
    pointed = latest(root)
    if pointed is not None and pointed in found:
        found.remove(pointed)
        found.insert(0, pointed)
    return found


def resumable(root: Path, verify: str = "full") -> list[tuple[Path, dict[str, Any]]]:
    """Complete checkpoints under ``root`` (``latest`` first, then newest first); broken
    ones are reported and skipped."""
    return scan(root, verify)[0]


def update_latest(root: Path, target: Path) -> None:
    """Point ``root/latest`` at ``target`` atomically and durably (a symlink swapped by
    rename, then the directory fsynced)."""
    link = root / LATEST
    tmp = root / f"{TMP_PREFIX}{LATEST}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)
    fsync_path(root)


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
    fsync_path(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def finalize(
    tmp: Path,
    final: Path,
    meta: dict[str, Any],
    files: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Complete a save: manifest and ``baton.json``, fsync everything, rename, ``latest``.

    ``files`` is the backend directory's manifest when it was computed already (off the
    training thread); otherwise it is computed here. A ``rollouts/`` folder's manifest is
    recorded as ``"rollout_files"``.
    """
    meta = dict(meta)
    if files is None:
        files = manifest(tmp / BACKEND_DIR) if (tmp / BACKEND_DIR).exists() else {}
    meta["files"] = files
    if (tmp / ROLLOUTS_DIR).is_dir():
        meta["rollout_files"] = manifest(tmp / ROLLOUTS_DIR)
    meta["format"] = max(2, int(meta.get("format", 2)))
    write_json_atomic(tmp / META_FILE, meta)
    fsync_tree(tmp)
    if final.exists():
        remove_checkpoint(final)
    os.replace(tmp, final)
    fsync_path(final.parent)
    update_latest(final.parent, final)
    return final
