"""Packed rows on Megatron's path: documents (conversations, preference pairs) packed into
rows by ``baton data prepare --seq-len N`` (read by ``baton.data.packed``), as the
per-sample dataset Megatron's streams draw micro-batches from.

A row is one sample: ``tokens`` (inputs), ``labels`` (targets), ``loss_mask`` (1 where the
target is supervised, Megatron's loss mask), ``position_ids`` (restarting at 0 in each
document) and ``segments`` (the document of each input, 1..k, 0 on padding: the forward
step builds the block-causal attention mask from them), plus ``documents`` (each
segment's global sequence index) and the values the objective reads, under
``values/<name>``: a stored reference's ``reference_logps`` (each segment's reference
log-probability sum, ``ReferenceUse.STORED``). Rows hold whole pairs, so a pair is never
split across micro-batches or data-parallel ranks.

Example::

    data = open_packed(config)                  # checked against the objective, seq_len
    rows = PackedRows(data, pad_id=data.manifest["tokenizer"]["eod_id"])
    rows.document_values[REFERENCE_LOGPS] = logps   # [num_sequences], once scored
    rows[0]["tokens"].shape                     # (seq_len,)
    rows[0]["values/reference_logps"].shape     # (max_documents_per_row,)
"""

from __future__ import annotations

from typing import Any

import numpy

from baton.backends.megatron.config import MegatronConfig
from baton.core.objectives import ObjectiveRun, ReferenceUse
from baton.data import DataError, parse_blend
from baton.data.packed import PackedDataset, check_objective
from baton.data.rollouts import VALUE_NAMES as ROLLOUT_VALUES

#: the prefix of a sample's keys that hold the objective's values
VALUES = "values/"
#: the document value of a stored reference: each document's log-probability sum under it
REFERENCE_LOGPS = "reference_logps"


def carried_values(run: ObjectiveRun) -> frozenset[str]:
    """The values the rows carry for ``run``: a rollout's (``baton.data.rollouts``: the
    sampling and reference log-probabilities, the advantage) for an objective that trains
    on rollouts (``rollout_rows.py``), else a stored reference's log-probabilities."""
    if run.objective.rollouts:
        return frozenset(ROLLOUT_VALUES)
    return frozenset({REFERENCE_LOGPS} if run.reference_use is ReferenceUse.STORED else ())


def check_data_objective(config: MegatronConfig) -> None:
    """``DataError`` (one line, naming the fix) when the data is not the kind the
    objective reads (``baton.data.packed.check_objective``): packed rows without prepared
    data or from a blend, pretraining on packed rows, an objective on packed rows given
    pretraining text or the other kind of packed data."""
    run, data = config.objective, config.data
    if not config.packed_rows:
        if data.data_path is not None and data.tokenizer is not None:
            for prefix in parse_blend(data.data_path).prefixes:
                check_objective(prefix, run.name)
        return
    if data.data_path is None or data.tokenizer is None:
        raise DataError(
            f"--objective {run.name} trains on prepared {run.objective.data.described}: pass "
            "--data-path PREFIX --tokenizer DIR (made by `baton data prepare ... --seq-len N`)"
        )
    prefixes = parse_blend(data.data_path).prefixes
    if len(prefixes) != 1:
        raise DataError(
            f"--objective {run.name} reads one prepared prefix, not the blend "
            f"{data.data_path!r}; prepare the sources together into one prefix"
        )
    check_objective(prefixes[0], run.name)


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
    as a dict of numpy arrays (the keys of the module docstring). ``document_values``
    (name -> one value per sequence, float64) adds each segment's value under
    ``values/<name>`` (0 where the row has no such segment)."""

    def __init__(self, data: PackedDataset, *, pad_id: int) -> None:
        self.data = data
        self.pad_id = pad_id
        self.document_values: dict[str, numpy.ndarray] = {}

    def __len__(self) -> int:
        return self.data.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        batch = self.data.batch([index], pad_id=self.pad_id)
        documents = batch.documents[0]
        sample: dict[str, Any] = {
            "tokens": batch.inputs[0],
            "labels": batch.targets[0],
            "loss_mask": batch.loss_mask[0].astype(numpy.float32),
            "position_ids": batch.positions[0].astype(numpy.int64),
            "segments": batch.segments[0].astype(numpy.int64),
            "documents": documents,
        }
        found = documents >= 0
        for name, per_sequence in self.document_values.items():
            sample[VALUES + name] = numpy.where(
                found, per_sequence[numpy.where(found, documents, 0)], 0.0
            )
        return sample
