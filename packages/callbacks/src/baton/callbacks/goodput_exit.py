"""The end of an attempt as its process really ends: a small watcher process, started by
``Goodput``, waits for the training process to exit (normally, or killed) and adds the
time since the step mark's last record to that record's ``shutdown``, so the
interpreter's exit after the last line (module teardown, seconds with torch loaded) and
a killed step's unfinished part count for the attempt, not as ``between_attempts``.

It runs as a script with the standard library alone (``python -I -S goodput_exit.py PID
MARK``: no baton, no site packages, a few milliseconds to start) and waits on a pidfd
(``os.pidfd_open``), polling ``/proc`` where there is none.

Example::

    from baton.callbacks.goodput_exit import watch_exit

    watch_exit(Path("runs/x/goodput.mark"))   # once per process and run directory
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: mark paths this process's watchers look after (one each), kept so none is collected
_WATCHERS: dict[Path, subprocess.Popen[bytes]] = {}


def watch_exit(mark: Path) -> None:
    """Start the watcher of this process for the step mark ``mark`` (once per mark)."""
    mark = mark.resolve()
    if mark in _WATCHERS:
        return
    _WATCHERS[mark] = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, str(os.getpid()), str(mark)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the training's process group spares it
    )


def wait_for_exit(pid: int) -> float:
    """Block until process ``pid`` has ended; returns the time it was seen to."""
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while _alive(pid):
            time.sleep(0.05)
        return time.time()
    select.select([descriptor], [], [])
    return time.time()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: its ``/proc`` state (a zombie has ended), else a signal 0."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False  # /proc works and has no such process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def extend_to(mark: Path, ended: float) -> None:
    """Add ``ended - t1`` to the mark's ``shutdown`` and make ``ended`` its ``t1``."""
    try:
        old = mark.read_bytes()
        record: dict[str, Any] = json.loads(old)
        tail = ended - float(record["t1"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if tail <= 0:
        return
    seconds = record.setdefault("seconds", {})
    seconds["shutdown"] = round(seconds.get("shutdown", 0.0) + tail, 6)
    record.update(t1=ended, exited=True)
    data = json.dumps(record, separators=(",", ":")).encode()
    descriptor = os.open(mark, os.O_WRONLY)
    try:
        os.pwrite(descriptor, data.ljust(len(old)), 0)
    finally:
        os.close(descriptor)


if __name__ == "__main__":
    extend_to(Path(sys.argv[2]), wait_for_exit(int(sys.argv[1])))
