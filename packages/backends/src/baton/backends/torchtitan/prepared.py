"""A prepared dataset (``baton data prepare``: Megatron's ``PREFIX.bin`` + ``.idx``) on
TorchTitan's data-loader protocol.

``PreparedDataLoader`` is a ``ParallelAwareDataloader`` (a ``torchdata``
``StatefulDataLoader``) over ``PreparedWindows``: the prepared tokens back to back,
cut into ``seq_len + 1``-token windows (inputs and labels shifted by one), positions
restarting after every end-of-document token as TorchTitan's text datasets do. Windows
are dealt round-robin to data-parallel ranks; the state is the next window and the
epoch, which TorchTitan's ``CheckpointManager`` saves with the model, so a resumed run
reads the batches an uninterrupted run would. With a Hugging Face tokenizer directory
(``--tokenizer``), the dataset's manifest must name the same tokenizer.

Example::

    cfg.tokenizer, cfg.hf_assets_path = tokenizer_config("tok/")
    cfg.dataloader = PreparedDataLoader.Config(dataset_path="data/corpus")
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer

from baton.backends.torchtitan.data import BatonDataLoader, RankShare
from baton.backends.torchtitan.rank_items import RankItems
from baton.core.objectives.pretrain import PRETRAIN
from baton.data import PreparedDataset, held_out_tokens, load_tokenizer
from baton.data.packed import check_objective
from baton.data.shards import check_rank


def document_positions(inputs: np.ndarray, eod_id: int) -> np.ndarray:
    """Positions of one window: 0 at its start and after every end-of-document token."""
    starts = np.zeros(len(inputs), dtype=np.int64)
    starts[1:] = inputs[:-1] == eod_id
    document = np.cumsum(starts)
    first = np.flatnonzero(np.concatenate(([1], starts[1:])))  # where each document starts
    return np.arange(len(inputs)) - first[document]


def split_tokens(data: PreparedDataset, eval_split: float, split: str) -> tuple[int, int]:
    """The token range of ``split`` (``train`` or ``eval``) when the last ``eval_split``
    of the documents are held out (``baton.data.held_out_tokens``, the rule of every
    engine); ``eval`` with nothing held out is all of them."""
    if split not in ("train", "eval"):
        raise ValueError(f"split {split!r} is neither 'train' nor 'eval'")
    cut = held_out_tokens(data, eval_split)
    if split == "eval" and cut == data.num_tokens:
        return (0, data.num_tokens)
    return (0, cut) if split == "train" else (cut, data.num_tokens)


class PreparedWindows(IterableDataset, Stateful):
    """``seq_len``-token training windows over a prepared dataset, round-robin by rank."""

    def __init__(
        self,
        data: PreparedDataset,
        *,
        eod_id: int,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        infinite: bool = True,
        tokens: tuple[int, int] | None = None,
    ) -> None:
        self.data = data
        #: the token range read (``tokens``; all of them by default): a split's documents
        self.first, end = tokens if tokens is not None else (0, data.num_tokens)
        self.eod_id = eod_id
        self.seq_len = seq_len
        check_rank(dp_rank, dp_world_size, type(self).__name__)  # before dividing by it
        num_windows = (end - self.first - 1) // seq_len
        if not infinite:  # a finite pass: every rank reads as many windows (no rank waits)
            num_windows -= num_windows % dp_world_size
        #: this rank's windows and its position in them
        self.windows = RankItems(
            num_windows,
            unit="window",
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            infinite=infinite,
            what=f"{data.prefix}: {end - self.first} tokens make {num_windows} windows "
            f"of {seq_len}",
            fix="prepare more data or lower training.seq_len",
            same="the same prepared data and training.seq_len",
            owner=type(self).__name__,
        )

    @property
    def items(self) -> RankItems:
        """This rank's windows (checked against the batch by ``BatonDataLoader``)."""
        return self.windows

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for window in self.windows:
            start = self.first + window * self.seq_len
            tokens = np.asarray(self.data.tokens[start : start + self.seq_len + 1], np.int64)
            inputs = tokens[:-1]
            positions = document_positions(inputs, self.eod_id)
            yield (
                {"input": torch.from_numpy(inputs), "positions": torch.from_numpy(positions)},
                torch.from_numpy(tokens[1:].copy()),
            )

    def state_dict(self) -> dict[str, Any]:
        return self.windows.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.windows.load_state_dict(state_dict, self.data.prefix)


class PreparedDataLoader(BatonDataLoader):
    """TorchTitan data loader over a prepared dataset (``PreparedWindows``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "prepared"
        dataset_path: str | None = None
        """The prefix ``baton data prepare --output`` wrote (``PREFIX.bin`` + ``.idx``)."""
        infinite: bool = True
        """Start again from the first window after the last one."""
        eval_split: float = 0.0
        """The fraction of documents held out for evaluation (the last ones; 0: none)."""
        split: str = "train"
        """With ``eval_split``: ``train`` reads the documents before the held-out ones,
        ``eval`` the held-out ones."""

    @classmethod
    def build_dataset(
        cls, config: Config, tokenizer: BaseTokenizer, share: RankShare
    ) -> PreparedWindows:
        path = cls.prepared_path(config)
        check_objective(path, PRETRAIN.name)  # not packed conversations
        data = PreparedDataset(path)
        eod_id = tokenizer.eos_id
        tokenizer_path = getattr(tokenizer, "tokenizer_path", None)
        if tokenizer_path:  # a Hugging Face tokenizer directory: the data must come from it
            info = load_tokenizer(tokenizer_path)
            data.check_tokenizer(info)
            eod_id = info.eod_id
        return PreparedWindows(
            data,
            tokens=split_tokens(data, config.eval_split, config.split),
            eod_id=int(eod_id if eod_id is not None else -1),
            seq_len=share.seq_len,
            dp_rank=share.dp_rank,
            dp_world_size=share.dp_world_size,
            infinite=config.infinite,
        )
