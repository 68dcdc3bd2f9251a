"""Byte-level language-model data over a real text corpus, with a resumable sampler.

The default corpus is the text of the Python language reference that ships with
every CPython (``pydoc_data.topics``, about 490 kB of English prose and grammar), so
it is available offline on any machine; ``path=`` reads any UTF-8 text file instead.

Example::

    data = ByteCorpus.load()                    # or ByteCorpus.load("my.txt")
    sampler = WindowSampler(data.train, seq_len=128, batch_size=16, seed=0)
    x, y = sampler.next_batch()                 # int64 [16, 128] each
    state = sampler.state_dict()                # resume continues the same order
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from baton.backends.corpus import load_text


@dataclass
class ByteCorpus:
    train: torch.Tensor
    val: torch.Tensor
    source: str

    @classmethod
    def load(cls, path: str | Path | None = None, val_fraction: float = 0.05) -> ByteCorpus:
        source, text = load_text(path)
        data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()
        split = int(len(data) * (1 - val_fraction))
        return cls(train=data[:split], val=data[split:], source=source)


class WindowSampler:
    """Shuffled non-overlapping windows of ``seq_len + 1`` bytes, sharded across ranks.

    Each epoch is a fresh permutation drawn from ``seed + epoch``; the state is the
    epoch and the position in it, so a resumed run sees exactly the same batches.
    """

    def __init__(
        self,
        data: torch.Tensor,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.data = data
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.num_windows = (len(data) - 1) // seq_len
        per_step = batch_size * world_size
        if self.num_windows < per_step:
            raise ValueError(
                f"corpus of {len(data)} tokens has {self.num_windows} windows of {seq_len}, "
                f"fewer than one global batch ({per_step}); use a smaller seq_len or batch_size"
            )
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_windows, generator=generator)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        per_step = self.batch_size * self.world_size
        if self.position + per_step > self.num_windows:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        chosen = self._order[self.position + self.rank : self.position + per_step : self.world_size]
        self.position += per_step
        offsets = chosen[:, None] * self.seq_len + torch.arange(self.seq_len + 1)
        windows = self.data[offsets]
        return windows[:, :-1], windows[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(
                f"data sampler seed {state['seed']} in checkpoint differs from {self.seed}"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)


def eval_batches(
    data: torch.Tensor, *, seq_len: int, batch_size: int, num_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of evenly spaced validation windows (the same every evaluation)."""
    count = min(batch_size * num_batches, (len(data) - 1) // seq_len)
    if count == 0:
        return []
    starts = torch.linspace(0, len(data) - seq_len - 2, count).long()
    windows = data[starts[:, None] + torch.arange(seq_len + 1)]
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(batch_size)]
