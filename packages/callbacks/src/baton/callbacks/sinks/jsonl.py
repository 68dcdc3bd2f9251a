"""Metrics as JSON lines: ``{"step": 10, "phase": "train", "time": 1731.2, "loss": 2.31, ...}``.

Example::

    CompositeLogger([JsonlSink()])  # writes <run_dir>/logs/metrics.jsonl

The file is appended to, so a resumed run continues it. Rows a killed run logged after
the step it resumes from are dropped when the sink opens, so no step appears twice.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import DriverView

FILE_NAME = "metrics.jsonl"


class JsonlSink:
    """Append one JSON object per log step or evaluation to ``metrics.jsonl``."""

    name = "jsonl"

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._fh: IO[str] | None = None

    def open(self, driver: DriverView) -> None:
        if self.path is None:
            self.path = Path(driver.log_dir) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            drop_rows_after(self.path, int(driver.step))
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        assert self._fh is not None, "JsonlSink.write before open"
        record: dict[str, Any] = {"step": step, "phase": phase, "time": time.time()}
        for key, value in metrics.items():
            # JSON has no NaN/Inf: write them as strings Python's float() reads back
            record[key] = value if math.isfinite(value) else str(value)
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def drop_rows_after(path: Path, step: int) -> int:
    """Rewrite ``path`` without rows past ``step`` (and without a torn last line);
    returns how many rows were dropped. The file is replaced atomically."""
    lines = path.read_text(encoding="utf-8").splitlines()
    kept: list[str] = []
    for line in lines:
        try:
            if int(json.loads(line)["step"]) <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return len(lines) - len(kept)


def read_jsonl(path: str | Path) -> list[dict[str, float]]:
    """Records of a metrics file merged by step, in step order. A step logged again
    (by a resumed run) takes the later values; a torn last line (a killed run) is
    ignored."""
    by_step: dict[int, dict[str, float]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            raw = json.loads(line)
            record = {k: float(v) for k, v in raw.items() if k != "phase"}
            step = int(raw["step"])
        except (ValueError, KeyError, TypeError):
            continue
        by_step[step] = {**by_step.get(step, {}), **record}
    return [by_step[s] for s in sorted(by_step)]
