"""Post-training data (``baton data prepare --seq-len N``: conversations or preference
pairs packed into rows) on TorchTitan's data-loader protocol, as TorchTitan's own inputs.

``PackedDataLoader`` is a ``ParallelAwareDataloader`` over ``PackedRows``: one packed
row per sample, dealt round-robin to data-parallel ranks, each as the
``({"input": ..., "positions": ...}, labels)`` pair TorchTitan's ``Trainer.train_step``
reads:

- ``labels`` are the row's next tokens at TorchTitan's ignore index (-100) wherever the
  target is not supervised (the prompt, padding, every document's first token), so
  TorchTitan's cross-entropy and its ``global_valid_tokens`` normalisation give the mean
  over the supervised tokens of the global batch;
- ``positions`` restart at 0 in every document, so TorchTitan's ``block_causal``
  attention (FlexAttention's document mask, built from the positions in
  ``Trainer.post_dataloading_process``) never crosses a document, and RoPE counts from
  each document's start.

Rows for an objective's own loss (``documents=True``: every objective without
TorchTitan's cross entropy, such as DPO) also carry ``segments`` (the document number of
each input token, 0 on padding) and ``documents`` (each segment's global sequence index,
-1 past the row's last), which ``objective_loss.RowFeed`` takes off before the batch
reaches the model. A row's documents stay together (a DPO pair is two documents of one
row), so they are never split across micro-batches or ranks. The state (epoch, next row) is saved by TorchTitan's
``CheckpointManager``.

Every row trains unless rows are held out for evaluation (``eval_split``: the last rows,
which training then leaves out; ``eval_data_path``: other data), ``held_out.py``.

Example::

    cfg.dataloader = PackedDataLoader.Config(dataset_path="data/chat")
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
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.tokenizer import BaseTokenizer

from baton.backends.torchtitan.data import BatonDataLoader, RankShare
from baton.backends.torchtitan.rank_items import RankItems
from baton.data import DataError, load_tokenizer
from baton.data.packed import PackedDataset, split_rows

#: what a row gives besides TorchTitan's inputs (taken off before the model sees them)
DOCUMENT_KEYS = ("segments", "documents")
#: the prefix of an objective's value a row carries in its input dict (``values.old_logps``:
#: rows from a stream that computes them; taken off before the model sees them)
VALUE_PREFIX = "values."


def row_sample(
    data: PackedDataset, row: int, *, documents: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Row ``row`` of ``data`` as TorchTitan's ``(input_dict, labels)``."""
    batch = data.batch([row])
    labels = np.where(batch.loss_mask[0], batch.targets[0], IGNORE_INDEX)
    inputs = {
        "input": torch.from_numpy(batch.inputs[0]),
        "positions": torch.from_numpy(batch.positions[0].astype(np.int64)),
    }
    if documents:
        inputs["segments"] = torch.from_numpy(batch.segments[0].astype(np.int64))
        inputs["documents"] = torch.from_numpy(batch.documents[0])
    return inputs, torch.from_numpy(labels)


class PackedRows(IterableDataset, Stateful):
    """The rows of a packed post-training dataset, one per sample, round-robin by rank."""

    def __init__(
        self,
        data: PackedDataset,
        *,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        documents: bool = False,
        infinite: bool = True,
    ) -> None:
        self.data = data
        self.documents = documents
        #: this rank's rows and its position in them
        self.rows = RankItems(
            data.num_rows,
            unit="row",
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            infinite=infinite,
            what=f"{data.prefix}: {data.num_rows} rows",
            fix="prepare more data",
            same="the same prepared data",
            owner=type(self).__name__,
        )

    @property
    def items(self) -> RankItems:
        """This rank's rows (checked against the batch by ``BatonDataLoader``)."""
        return self.rows

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        served = 0
        for row in self.rows:
            served += 1
            yield row_sample(self.data, row, documents=self.documents)
        if not self.rows.infinite:  # a finite pass: as many rows on every rank (FSDP's
            share = -(-self.rows.count // self.rows.dp_world_size)  # forward is collective)
            for _ in range(share - served):  # with nothing supervised: no loss, no count
                inputs, labels = row_sample(self.data, 0, documents=self.documents)
                yield inputs, torch.full_like(labels, IGNORE_INDEX)

    def state_dict(self) -> dict[str, Any]:
        return self.rows.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows.load_state_dict(state_dict, self.data.prefix)


def open_packed(path: str, tokenizer: BaseTokenizer, seq_len: int) -> PackedDataset:
    """The packed dataset at ``path``, checked against the run: rows as long as
    ``training.seq_len``, and the tokenizer it was prepared with."""
    data = PackedDataset(path)
    if data.seq_len != seq_len:
        raise DataError(
            f"{data.prefix} was packed into rows of {data.seq_len} tokens but the run's "
            f"seq_len is {seq_len}; pass --seq-len {data.seq_len}"
        )
    tokenizer_path = getattr(tokenizer, "tokenizer_path", None)
    if tokenizer_path:
        data.indexed.check_tokenizer(load_tokenizer(tokenizer_path))
    return data


class PackedDataLoader(BatonDataLoader):
    """TorchTitan data loader over packed post-training rows (``PackedRows``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "packed"
        dataset_path: str | None = None
        """The prefix ``baton data prepare --seq-len N --output`` wrote."""
        documents: bool = False
        """Also yield each token's document and each document's sequence index (an
        objective's own loss reads them)."""
        infinite: bool = True
        """Start again from the first row after the last one."""
        eval_split: float = 0.0
        """The fraction of the rows held out for evaluation (the last ones; 0: none);
        training reads the rows before them (``held_out.set_held_out``)."""
        eval_data_path: str | None = None
        """Other prepared data to evaluate on (every row of ``dataset_path`` trains)."""
        split: str = "train"
        """``train`` reads the rows before the held-out ones, ``eval`` the held-out ones
        (every row when none are held out: evaluation data of its own)."""

    @classmethod
    def build_dataset(
        cls, config: Config, tokenizer: BaseTokenizer, share: RankShare
    ) -> PackedRows:
        data = open_packed(cls.prepared_path(config), tokenizer, share.seq_len)
        trained, held = split_rows(data, config.eval_split)
        return PackedRows(
            held if config.split == "eval" and held is not None else trained,
            dp_rank=share.dp_rank,
            dp_world_size=share.dp_world_size,
            documents=config.documents,
            infinite=config.infinite,
        )
