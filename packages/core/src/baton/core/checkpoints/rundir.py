"""One run per run directory: an exclusive lock, and no silent replacement of checkpoints.

A run holds ``<run_dir>/.baton.lock`` with ``flock`` for its whole life; a second run on
the same directory fails at once with the holder's host and pid. The operating system
drops the lock when the holder exits, also when it is killed, so a stale lock never
needs cleaning up::

    from baton.core.checkpoints.rundir import RunDirLock

    with RunDirLock("runs/quickstart"):
        ...  # RunDirBusy: "runs/quickstart is in use by another baton run (host h, pid 4242 ..."

``set_aside`` moves earlier checkpoints and logs out of the way (renamed, never deleted)
for a run started with ``overwrite``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from baton.core.checkpoints.files import CHECKPOINTS_DIR
from baton.core.errors import RunError

LOCK_FILE = ".baton.lock"


class RunDirBusy(RunError):
    """Another live run holds the run directory."""


class RunDirLock:
    """Exclusive ownership of a run directory (``flock`` on ``.baton.lock``)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.created_run_dir = False
        self.created_lock_file = False
        #: the folders above the run directory that ``acquire`` made, nearest first
        self.created_parents: list[Path] = []
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``RunDirBusy`` naming the holder; creates the directory."""
        if not self.run_dir.exists():
            self.created_parents = [d for d in self.run_dir.parents if not d.exists()]
            self.run_dir.mkdir(parents=True)
            self.created_run_dir = True
        self.created_lock_file = not self.path.exists()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read_holder(fd))
                os.close(fd)
                raise RunDirBusy(
                    f"{self.run_dir} is in use by another baton run ({holder}); wait for it "
                    "to finish, stop it, or give this run another --run-dir"
                ) from None
            # the file may have been replaced between open and flock: lock the current one
            if _same_file(fd, self.path):
                break
            os.close(fd)
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd

    def release(self, *, remove_if_unused: bool = False, remove_created: bool = False) -> None:
        """Drop the lock. ``remove_if_unused``: a run directory this lock created and
        nothing else wrote to is removed again (a run that failed before it began).
        ``remove_created``: a run directory this lock created is removed with all it
        holds, which is that run's alone (a run refused before it trained: its patch
        report, a data cache its backend built); in a directory that was there before,
        the lock file, when this lock created it."""
        if self._fd is None:
            return
        if self.created_run_dir and (remove_created or (remove_if_unused and self._unused())):
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for parent in self.created_parents:  # ``runs/`` too, where this run made it
                with contextlib.suppress(OSError):
                    parent.rmdir()
        elif remove_created and self.created_lock_file:  # the user's directory: our lock only
            self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def _unused(self) -> bool:
        """Whether the run directory holds no file but the lock."""
        return all(p == self.path or p.is_dir() for p in self.run_dir.rglob("*"))

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return dict(json.loads(os.pread(fd, 4096, 0).decode() or "{}"))
    except (OSError, ValueError, TypeError):
        return {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    since = holder.get("since")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {started}"


def set_aside(run_dir: Path, names: tuple[str, ...] = (CHECKPOINTS_DIR, "logs")) -> list[Path]:
    """Rename ``run_dir/<name>`` to ``<name>.replaced-<UTC time>`` for each that exists;
    returns the new paths. Nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    moved: list[Path] = []
    for name in names:
        source = run_dir / name
        if not source.exists():
            continue
        target = run_dir / f"{name}.replaced-{stamp}"
        n = 1
        while target.exists():
            n += 1
            target = run_dir / f"{name}.replaced-{stamp}-{n}"
        os.replace(source, target)
        moved.append(target)
    return moved
