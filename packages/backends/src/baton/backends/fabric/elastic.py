"""Batches in one global order, resumable on any number of ranks.

``GlobalBatches`` reads a map-style dataset in one seeded order per epoch that does not
depend on the number of ranks: each step takes the next ``batch_size x world_size``
samples of that order (a global batch), rank ``r`` the ``r``-th slice of it. Its
position is the count of samples consumed in the epoch, the same on every rank, so a
run saved on 2 ranks resumes on 1 (a lost node) or on 4 (a bigger allocation) at the
next sample of the global order: every sample of an epoch is read exactly once, whatever
the ranks did in between. A tail shorter than a global batch is left out of the epoch.

The Fabric backend shards it itself (``shard_stream`` calls ``shard(rank, world_size)``);
the recipes' prepared data (``--data-path``/``--tokenizer``) goes through it.

Example::

    train = GlobalBatches(windows, batch_size=8, seed=0)     # what text_loaders returns
    mine = train.shard(rank=1, world_size=2)                 # what each rank reads
    x, y = next(iter(mine))                                  # samples 8..15 of the order
    state = mine.state_dict()     # {"epoch": 0, "position": 16, "samples": N, ...}
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from baton.data import DataError
from baton.data.shards import check_rank

log = logging.getLogger(__name__)


class GlobalBatches:
    """Per-rank batches of ``dataset`` cut from one seeded global order per epoch."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise DataError(f"GlobalBatches needs batch_size >= 1, got batch_size={batch_size}")
        check_rank(rank, world_size, "GlobalBatches")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        #: epochs completed
        self.epoch = 0
        #: samples of the current epoch's order consumed by all ranks together
        self.position = 0

    def shard(self, rank: int, world_size: int) -> GlobalBatches:
        """The same data and order, read as rank ``rank`` of ``world_size``."""
        shard = GlobalBatches(
            self.dataset,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
            rank=rank,
            world_size=world_size,
        )
        shard.epoch, shard.position = self.epoch, self.position
        return shard

    @property
    def samples(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per rank in a whole epoch."""
        return self.samples // self.global_batch

    def order(self, epoch: int) -> torch.Tensor:
        """The global order of epoch ``epoch``: a permutation seeded by ``seed + epoch``."""
        if not self.shuffle:
            return torch.arange(self.samples)
        return torch.randperm(
            self.samples, generator=torch.Generator().manual_seed(self.seed + epoch)
        )

    def indices(self) -> Iterator[list[int]]:
        """This rank's sample indices, batch by batch, from the current position; at the
        end of the epoch the next ``iter`` starts the next epoch."""
        order = self.order(self.epoch)
        while self.position + self.global_batch <= self.samples:
            start = self.position + self.rank * self.batch_size
            self.position += self.global_batch
            yield order[start : start + self.batch_size].tolist()
        self.epoch += 1
        self.position = 0

    def __iter__(self) -> Iterator[Any]:
        for batch in self.indices():
            yield default_collate([self.dataset[i] for i in batch])

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "samples": self.samples,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved global position (any number of ranks; the data and seed
        must be the ones the run was saved with)."""
        if int(state["samples"]) != self.samples or int(state["seed"]) != self.seed:
            raise ValueError(
                f"cannot resume the data position: the checkpoint read {state['samples']} "
                f"samples in the order of seed {state['seed']}, this run has {self.samples} "
                f"with seed {self.seed}; resume with the data and seed the run was saved with"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        saved = int(state.get("world_size", self.world_size))
        if saved != self.world_size or int(state.get("batch_size", 0)) != self.batch_size:
            log.info(
                "data continues at sample %d of epoch %d of the global order: saved as %d "
                "rank(s) x %s, now %d rank(s) x %d",
                self.position,
                self.epoch,
                saved,
                state.get("batch_size"),
                self.world_size,
                self.batch_size,
            )
