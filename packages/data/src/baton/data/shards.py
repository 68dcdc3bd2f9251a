"""A data stream's share of the data-parallel ranks: the checks every stream makes before
it reads, so each says the same thing the same way.

Rank ``r`` of ``n`` reads items ``r, r + n, r + 2n, ...`` (or the ``r``-th slice of each
global batch); a stream refuses a rank outside ``0 <= r < n`` and data too small to give
every rank its share of one step::

    check_rank(dp_rank, dp_world_size, "PackedRows")
    check_enough_for_ranks(
        data.num_rows, dp_world_size,
        what=f"{data.prefix}: {data.num_rows} rows", fix="prepare more data",
    )
    # DataError: data/sft: 1 rows, fewer than the 2 data-parallel ranks; prepare more data
"""

from __future__ import annotations

from baton.data.errors import DataError


def check_rank(rank: int, world_size: int, stream: str) -> None:
    """Refuse a data-parallel ``rank`` that is not one of ``world_size`` ranks (``DataError``
    naming ``stream``)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(
            f"{stream} was given data-parallel rank {rank} of {world_size}; a rank is "
            "0 <= rank < world_size, with world_size >= 1"
        )


def check_enough_for_ranks(
    have: int,
    world_size: int,
    *,
    what: str,
    fix: str,
    per_rank: int = 1,
    unit: str = "micro-batch",
) -> None:
    """Refuse data of ``have`` items (samples, windows, rows) fewer than ``per_rank`` items
    for each of ``world_size`` ranks: ``DataError`` of ``what`` (the data and its count),
    what is missing, and ``fix``.

    >>> check_enough_for_ranks(8, 2, what="dataset has 8 samples", fix="use more", per_rank=4)
    >>> check_enough_for_ranks(6, 2, what="dataset has 6 samples", fix="use more", per_rank=4)
    Traceback (most recent call last):
    baton.data.errors.DataError: dataset has 6 samples, fewer than one micro-batch across data-parallel ranks (4 x 2); use more
    """
    if have >= per_rank * world_size:
        return
    if per_rank == 1:
        share = f"the {world_size} data-parallel ranks"
    else:
        share = f"one {unit} across data-parallel ranks ({per_rank} x {world_size})"
    raise DataError(f"{what}, fewer than {share}; {fix}")
