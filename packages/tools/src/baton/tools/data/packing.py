"""Best-fit-decreasing packing of documents into rows of a fixed capacity.

Example::

    from baton.tools.data.packing import best_fit_decreasing, fill

    rows = best_fit_decreasing([5, 3, 4, 2, 6], capacity=8)   # [[4, 3], [0, 1], [2]]
    fill([5, 3, 4, 2, 6], rows, capacity=8)                    # 20 / 24: the rest is padding

Items are placed longest first (ties in input order), each into the fullest row it still
fits in, else into a new row; rows come out in the order they were opened, and a row lists
its items in the order they were placed. The same lengths always give the same rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """The indices of ``lengths`` grouped into rows whose lengths sum to at most ``capacity``.

    Raises ``ValueError`` for an item longer than ``capacity`` (callers check first).
    """
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    rows: list[list[int]] = []
    # (space left, row number), sorted: the first entry with space >= length is the best fit
    free: list[tuple[int, int]] = []
    for index in order:
        length = lengths[index]
        if length > capacity:
            raise ValueError(f"item {index} of length {length} exceeds the capacity {capacity}")
        slot = bisect.bisect_left(free, (length, -1))
        if slot < len(free):
            space, row = free.pop(slot)
        else:
            space, row = capacity, len(rows)
            rows.append([])
        rows[row].append(index)
        if space - length > 0:
            bisect.insort(free, (space - length, row))
    return rows


def fill(lengths: Sequence[int], rows: Sequence[Sequence[int]], capacity: int) -> float:
    """The fraction of the rows' capacity that holds tokens (1.0: no padding)."""
    if not rows:
        return 0.0
    return sum(lengths[i] for row in rows for i in row) / (len(rows) * capacity)
