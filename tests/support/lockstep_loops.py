"""Loops for ``benchmarks.harness.Lockstep``'s tests (top-level functions, so a spawned
process can import them)."""

from __future__ import annotations

import time
from collections.abc import Callable


def stamped(blocks: int, mark: Callable[[], None]) -> list[int]:
    """``blocks`` blocks; returns the monotonic clock (shared by processes) at each end."""
    stamps = []
    for _ in range(blocks):
        stamps.append(time.monotonic_ns())
        mark()
    return stamps


def failing(mark: Callable[[], None]) -> None:
    """One block, then an error."""
    mark()
    raise ValueError("boom")
