"""The items a data-parallel rank reads from a prepared dataset, dealt round-robin: rank
``r`` of ``n`` reads items ``r, r + n, r + 2n, ...``, then (``infinite``) the next epoch
from the start again. The position (epoch, next item) is what TorchTitan's
``CheckpointManager`` saves with the loader, under the item's own name (``row`` for
packed post-training rows, ``window`` for pretraining windows), with the number of items
so that a resume on other data is refused.

Example::

    items = RankItems(100, unit="row", dp_rank=1, dp_world_size=4, what="data/chat: 100 rows",
                      fix="prepare more data", same="the same prepared data")
    next(iter(items))         # 1, then 5, 9, ...
    items.state_dict()        # {"epoch": 0, "row": 5, "num_rows": 100}
    items.check_batch(32)     # DataError: fewer items than one batch over the ranks

A training stream never repeats an item within a batch: data with fewer items than one
batch over the data-parallel ranks (``check_batch``, called by every baton loader) is
refused, as the other engines refuse it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from baton.data.shards import check_enough_for_ranks, check_rank


class RankItems:
    """This rank's share of ``count`` items, in order, with its resumable position."""

    def __init__(
        self,
        count: int,
        *,
        unit: str,
        dp_rank: int,
        dp_world_size: int,
        infinite: bool,
        what: str,
        fix: str,
        same: str,
        owner: str,
    ) -> None:
        """``what``/``fix``: the data and the fix named when it has fewer items than ranks;
        ``same``: what a resume must keep; ``owner``: the dataset named for a bad rank."""
        check_rank(dp_rank, dp_world_size, owner)
        check_enough_for_ranks(count, dp_world_size, what=what, fix=fix)
        self.count = count
        self.unit = unit
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.infinite = infinite
        self.same = same
        self.what, self.fix = what, fix
        self.epoch = 0
        self.next = dp_rank  # the next item this rank reads

    def check_batch(self, batch_size: int) -> None:
        """Refuse (``DataError``) a batch of ``batch_size`` items a rank that the data
        cannot fill once over every rank: it would read an item twice in one step."""
        check_enough_for_ranks(
            self.count,
            self.dp_world_size,
            what=self.what,
            fix=f"use a smaller --batch-size or {self.fix}",
            per_rank=batch_size,
            unit="batch",
        )

    def __iter__(self) -> Iterator[int]:
        while True:
            while self.next < self.count:
                item = self.next
                self.next += self.dp_world_size
                yield item
            if not self.infinite:
                return
            self.epoch += 1
            self.next = self.dp_rank

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, self.unit: self.next, f"num_{self.unit}s": self.count}

    def load_state_dict(self, state: dict[str, Any], prefix: str) -> None:
        """The saved position; ``ValueError`` naming ``prefix`` if the count differs."""
        saved = state[f"num_{self.unit}s"]
        if saved != self.count:
            raise ValueError(
                f"{prefix}: the checkpoint's data had {saved} {self.unit}s, this one has "
                f"{self.count}: resume with {self.same}"
            )
        self.epoch = int(state["epoch"])
        self.next = int(state[self.unit])
