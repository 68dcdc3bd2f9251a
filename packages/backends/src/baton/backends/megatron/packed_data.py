"""Post-training data on Megatron's path: packed rows of conversations or preference pairs
(``baton data prepare --seq-len N``, read by ``baton.data.packed``) as the per-sample
dataset Megatron's streams draw micro-batches from.

A row is one sample: ``tokens`` (inputs), ``labels`` (targets), ``loss_mask`` (1 where the
target is supervised, Megatron's loss mask), ``position_ids`` (restarting at 0 in each
document) and ``segments`` (the document of each input, 1..k, 0 on padding: the forward
step builds the block-causal attention mask from them), plus ``documents`` (each
segment's global sequence index) and, for DPO, ``reference_logps`` (each segment's
reference log-probability sum). Rows hold whole pairs, so a pair is never split across
micro-batches or data-parallel ranks.

Example::

    data = open_packed(config)                  # checked against the objective, seq_len
    rows = PackedRows(data, pad_id=data.manifest["tokenizer"]["eod_id"])
    rows[0]["tokens"].shape                     # (seq_len,)
"""

from __future__ import annotations

from typing import Any

import numpy

from baton.backends.megatron.config import MegatronConfig
from baton.data import DataError, parse_blend
from baton.data.packed import PackedDataset, check_objective


def check_data_objective(config: MegatronConfig) -> None:
    """``DataError`` (one line, naming the fix) when the data does not fit the objective:
    post-training without prepared data or with a blend, pretraining on packed
    conversations, SFT or DPO on pretraining text or on the other kind of packed data."""
    objective, data = config.objective, config.data
    if objective == "pretrain":
        if data.data_path is not None and data.tokenizer is not None:
            for prefix in parse_blend(data.data_path).prefixes:
                check_objective(prefix, "pretrain")
        return
    if data.data_path is None or data.tokenizer is None:
        raise DataError(
            f"--objective {objective} trains on prepared "
            f"{'preference pairs' if objective == 'dpo' else 'conversations'}: pass "
            "--data-path PREFIX --tokenizer DIR (made by `baton data prepare ... --seq-len N`)"
        )
    if len(parse_blend(data.data_path).prefixes) != 1:
        raise DataError(
            f"--objective {objective} reads one prepared prefix, not the blend "
            f"{data.data_path!r}; prepare the sources together into one prefix"
        )
    check_objective(parse_blend(data.data_path).prefixes[0], objective)


def open_packed(config: MegatronConfig) -> PackedDataset:
    """The post-training data of ``config`` (checked by ``check_data_objective`` and, for
    its tokenizer, by ``data.open_prepared``), refused when its rows are not
    ``config.seq_len`` tokens wide."""
    assert config.data.data_path is not None
    data = PackedDataset(parse_blend(config.data.data_path).prefixes[0])
    if data.seq_len != config.seq_len:
        raise DataError(
            f"{data.prefix} was packed into rows of seq_len {data.seq_len}, the run's "
            f"seq_len is {config.seq_len}; pass --seq-len {data.seq_len}"
        )
    return data


class PackedRows:
    """A :class:`PackedDataset` as Megatron's per-sample dataset: ``rows[i]`` is row ``i``
    as a dict of numpy arrays (the keys of the module docstring). ``reference`` (float64,
    one value per sequence) adds each segment's ``reference_logps`` (0 where the row has
    no such segment)."""

    def __init__(
        self, data: PackedDataset, *, pad_id: int, reference: numpy.ndarray | None = None
    ) -> None:
        self.data = data
        self.pad_id = pad_id
        self.reference = reference

    def __len__(self) -> int:
        return self.data.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        batch = self.data.batch([index], pad_id=self.pad_id)
        sample: dict[str, Any] = {
            "tokens": batch.inputs[0],
            "labels": batch.targets[0],
            "loss_mask": batch.loss_mask[0].astype(numpy.float32),
            "position_ids": batch.positions[0].astype(numpy.int64),
            "segments": batch.segments[0].astype(numpy.int64),
            "documents": batch.documents[0],
        }
        if self.reference is not None:
            documents = batch.documents[0]
            found = documents >= 0
            sample["reference_logps"] = numpy.where(
                found, self.reference[numpy.where(found, documents, 0)], 0.0
            )
        return sample
