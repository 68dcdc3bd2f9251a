"""Metrics as one plain line per log step on the console (rank 0).

Example::

    CompositeLogger(["console"])
    # step    100 | loss 2.3125 | lr 0.001 | throughput/tokens_per_s 51,200
    # eval    100 | eval/loss 2.2017
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import DriverView


class ConsoleSink:
    """Print ``step N | key value | ...`` lines (``eval N | ...`` for evaluation),
    optionally only some keys; a key ``a|b`` shows ``a`` when logged, else ``b``."""

    name = "console"

    def __init__(self, keys: Sequence[str] | None = None, stream: IO[str] | None = None) -> None:
        self.keys = list(keys) if keys is not None else None
        self.stream = stream

    def open(self, driver: DriverView) -> None:
        pass

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None:
        keys = self.keys if self.keys is not None else sorted(metrics)
        shown = (_first_logged(k, metrics) for k in keys)
        parts = [f"{k} {_format(metrics[k])}" for k in shown if k is not None]
        if not parts:
            return
        label = "step" if phase == "train" else phase
        print(
            f"{label:4} {step:6d} | " + " | ".join(parts),
            file=self.stream or sys.stdout,
            flush=True,
        )

    def close(self) -> None:
        pass


def _first_logged(key: str, metrics: dict[str, float]) -> str | None:
    """The first of ``key``'s ``|``-separated alternatives that was logged."""
    return next((k for k in key.split("|") if k in metrics), None)


def _format(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
