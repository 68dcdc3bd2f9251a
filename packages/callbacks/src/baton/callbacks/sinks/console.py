"""Metrics as one plain line per log step on the console (rank 0).

Example::

    CompositeLogger(["console"])
    # step    100 | loss 2.3125 | lr 0.001 | throughput/tokens_per_s 51,200
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any


class ConsoleSink:
    """Print ``step N | key value | ...`` lines (optionally only some keys)."""

    name = "console"

    def __init__(self, keys: Sequence[str] | None = None, stream: IO[str] | None = None) -> None:
        self.keys = list(keys) if keys is not None else None
        self.stream = stream

    def open(self, driver: Any) -> None:
        pass

    def write(self, step: int, metrics: dict[str, float]) -> None:
        keys = self.keys if self.keys is not None else sorted(metrics)
        parts = [f"{k} {_format(metrics[k])}" for k in keys if k in metrics]
        print(f"step {step:6d} | " + " | ".join(parts), file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        pass


def _format(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
