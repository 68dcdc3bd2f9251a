"""The goodput ledger's file: append-only JSON lines in the run directory, and its sum.

Each line is one interval of one attempt (one process of the run) with the seconds
spent in each category between ``t0`` and ``t1`` (wall-clock times); an attempt's lines
tile its life from its process start to its last line. What lies between one attempt's
last line and the next attempt's process start is ``between_attempts``.

Beside it, ``goodput.mark`` holds the interval in progress (a record like a ledger
line), rewritten in place after every step with one ``pwrite`` and no fsync: a process
kill cannot lose it (the page cache outlives the process), only a machine crash. It is
extended to the process's real end by a watcher (``goodput_exit``). ``read_ledger`` adds it when the ledger
has no later line of its attempt, and the next attempt appends it to the ledger before
taking the mark over, so the steps a killed attempt completed after its last line are
counted, and counted as redone when the next attempt does them again.

Example::

    from baton.callbacks.goodput_ledger import read_ledger, summarise

    summary = summarise(read_ledger(Path("runs/x")))
    summary.seconds["productive"] / summary.wall_s   # the run's goodput
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

#: the ledger's file name in the run directory
LEDGER_FILE = "goodput.jsonl"
#: the interval in progress, rewritten after every step (``StepMark``)
MARK_FILE = "goodput.mark"

#: every category of wall time, in the order tables and charts show them
CATEGORIES: tuple[str, ...] = (
    "productive",
    "data_waiting",
    "startup",
    "restore",
    "evaluation",
    "checkpoint",
    "redone",
    "shutdown",
    "between_attempts",
)

#: what each category holds, for tables and documentation
MEANING: dict[str, str] = {
    "productive": "steps first completed (less data waiting, evaluation, save blocking)",
    "data_waiting": "those steps waiting for their batches (where the backend times it)",
    "startup": "process start to setup done, and each attempt's first step (compilation)",
    "restore": "loading the checkpoint and the run record (setup to the first step)",
    "evaluation": "evaluation phases",
    "checkpoint": "time the loop was blocked saving checkpoints",
    "redone": "steps whose number an earlier attempt (or a rollback) had completed",
    "shutdown": "after the last step: final saves, teardown, exit (or a killed step)",
    "between_attempts": "an attempt's process end to the next attempt's process start",
}


@dataclass
class Attempt:
    """One process's part of the run: its span and the seconds per category."""

    attempt: str
    t0: float
    t1: float
    first_step: int
    last_step: int
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    steps: dict[str, int] = field(default_factory=lambda: {"new": 0, "redone": 0})


@dataclass
class Summary:
    """The whole run: attempts in order, totals per category and the wall time they tile."""

    attempts: list[Attempt]
    seconds: dict[str, float]
    steps: dict[str, int]
    wall_s: float

    @property
    def goodput(self) -> float:
        """The share of wall time spent on productive steps."""
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else 0.0


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The ledger's records, then the step mark where it is newer than every line of its
    attempt; a last line cut short by a kill is left out."""
    records = read_ledger_lines(run_dir)
    mark = unwritten_mark(run_dir, records)
    return [*records, mark] if mark is not None else records


def read_ledger_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of the ledger file alone; a last line cut short by a kill is left out."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        return []
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a SIGKILL mid-write
    return records


def unwritten_mark(run_dir: Path, lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The step mark's record when no ledger line of its attempt reaches its ``t1``."""
    try:
        mark = json.loads((Path(run_dir) / MARK_FILE).read_bytes())
        attempt, t1 = mark["attempt"], float(mark["t1"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no mark, or an empty one
    if any(line.get("attempt") == attempt and line.get("t1", 0.0) >= t1 for line in lines):
        return None
    return cast(dict[str, Any], mark)


def summarise(records: list[dict[str, Any]]) -> Summary:
    """Group the records by attempt (in file order) and attribute the gaps between them."""
    attempts: dict[str, Attempt] = {}
    for record in records:
        key = str(record["attempt"])
        item = attempts.get(key)
        if item is None:
            item = attempts[key] = Attempt(
                key, record["t0"], record["t1"], record["step"], record["step"]
            )
        item.t1 = max(item.t1, record["t1"])
        item.last_step = max(item.last_step, record["step"])
        for name, value in record.get("seconds", {}).items():
            item.seconds[name] = item.seconds.get(name, 0.0) + value
        for name, value in record.get("steps", {}).items():
            item.steps[name] = item.steps.get(name, 0) + value
    ordered = sorted(attempts.values(), key=lambda a: a.t0)
    for before, after in itertools.pairwise(ordered):
        # an end seen late by the exit watcher yields to the next process's start
        overlap = min(max(before.t1 - after.t0, 0.0), before.seconds.get("shutdown", 0.0))
        before.t1 -= overlap
        before.seconds["shutdown"] = before.seconds.get("shutdown", 0.0) - overlap
        after.seconds["between_attempts"] += max(after.t0 - before.t1, 0.0)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    steps = {"new": 0, "redone": 0}
    for item in ordered:
        for name, value in item.seconds.items():
            totals[name] = totals.get(name, 0.0) + value
        for name, value in item.steps.items():
            steps[name] = steps.get(name, 0) + value
    wall = ordered[-1].t1 - ordered[0].t0 if ordered else 0.0
    return Summary(ordered, totals, steps, wall)


class LedgerWriter:
    """Appends records to the ledger; each is flushed and fsynced before ``append``
    returns, so a SIGKILL loses at most the interval not yet written."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LEDGER_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._file = self.path.open("a", encoding="utf-8")
        if created:
            _fsync_dir(self.path.parent)

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class StepMark:
    """The interval in progress in ``goodput.mark``, rewritten in place by one ``pwrite``
    at offset 0 (no fsync: about 10 µs a step with its JSON). A record shorter than an
    earlier one is padded with spaces, which JSON ignores; records stay well within one
    page, so a kill never leaves half of one.

    Example::

        mark = StepMark(Path("runs/x"))   # empties the file: take it over after recovery
        mark.write({"attempt": "h:1@0", "t0": 0.0, "t1": 1.5, "step": 3, ...})
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / MARK_FILE
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._width = 0
        self.last = b""

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        data = json.dumps(record, separators=(",", ":")).encode()
        self._width = max(self._width, len(data))
        data = data.ljust(self._width)
        os.pwrite(self._fd, data, 0)
        self.last = data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
