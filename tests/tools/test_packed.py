"""Post-training data: write_packed, then PackedDataset reads the same rows and batches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from baton.data import DataError, PreparedDataset, TokenizerInfo, read_manifest
from baton.data.indexed_writer import IndexedWriter
from baton.data.packed import PackedDataset, check_objective, mask_path, write_packed

SEQ_LEN = 8
ROWS = [  # row 0: two documents (5 + 4 = 9 = seq_len + 1); row 1: one, padded
    [([3, 4, 5, 6, 0], [0, 0, 1, 1, 1]), ([7, 8, 9, 0], [1, 1, 1, 1])],
    [([10, 11, 12], [0, 1, 1])],
]


@pytest.fixture
def chat(tmp_path: Path, tokenizer: TokenizerInfo) -> str:
    prefix = str(tmp_path / "chat")
    write_packed(prefix, ROWS, objective="sft", seq_len=SEQ_LEN, tokenizer=tokenizer, mask="all")
    return prefix


def test_round_trip_keeps_rows_documents_and_masks(chat: str, tokenizer: TokenizerInfo) -> None:
    data = PackedDataset(chat)
    assert (data.objective, data.seq_len, data.num_rows) == ("sft", SEQ_LEN, 2)
    assert (data.num_sequences, data.max_documents_per_row) == (3, 2)
    for number, row in enumerate(ROWS):
        read = data.row(number)
        assert [tokens.tolist() for tokens, _ in read] == [list(t) for t, _ in row]
        # the first token of every document is written 0 (nothing predicts it)
        assert [mask.tolist() for _, mask in read] == [[0, *m[1:]] for _, m in row]
    manifest = data.manifest
    assert manifest["format"] == "baton-prepared-data/2" and manifest["mask"] == "all"
    assert manifest["packing"] == {"method": "given", "rows": 2, "fill": 12 / 18}
    assert (manifest["tokens"], manifest["supervised_tokens"]) == (12, 8)
    # Megatron's view: sequences are documents, its documents are the rows
    indexed = PreparedDataset(chat)
    assert indexed.sequence_lengths.tolist() == [5, 4, 3]
    assert indexed.document_indices.tolist() == [0, 2, 3]
    assert read_manifest(chat).tokenizer_fingerprint == tokenizer.fingerprint  # type: ignore[union-attr]


def test_batch_fields(chat: str) -> None:
    batch = PackedDataset(chat).batch([0, 1], pad_id=-7)
    assert batch.inputs.tolist() == [[3, 4, 5, 6, 0, 7, 8, 9], [10, 11, -7, -7, -7, -7, -7, -7]]
    assert batch.targets.tolist() == [[4, 5, 6, 0, 7, 8, 9, 0], [11, 12, -7, -7, -7, -7, -7, -7]]
    # False at each document's first token (target 7 starts document 2) and on padding
    assert batch.loss_mask.tolist() == [
        [False, True, True, True, False, True, True, True],
        [True, True, False, False, False, False, False, False],
    ]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.segments.tolist() == [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.documents.tolist() == [[0, 1], [2, -1]]
    assert batch.supervised_tokens == 8
    assert (batch.inputs.dtype, batch.positions.dtype, batch.documents.dtype) == (
        np.int64,
        np.int32,
        np.int64,
    )
    assert batch.inputs.shape == batch.loss_mask.shape == (2, SEQ_LEN)


def test_preference_rows_keep_pairs(tmp_path: Path, tokenizer: TokenizerInfo) -> None:
    pair = [([3, 4, 5], [0, 0, 1]), ([3, 4, 6, 7], [0, 0, 1, 1])]
    with pytest.raises(DataError, match="whole pairs"):
        write_packed(
            tmp_path / "p", [pair[:1]], objective="preference", seq_len=8, tokenizer=tokenizer
        )
    assert not list(tmp_path.iterdir())
    write_packed(tmp_path / "p", [pair], objective="preference", seq_len=8, tokenizer=tokenizer)
    data = PackedDataset(tmp_path / "p")
    assert data.objective == "preference"
    assert data.batch([0]).segments.tolist() == [[1, 1, 1, 2, 2, 2, 0, 0]]
    check_objective(tmp_path / "p", "dpo")
    with pytest.raises(DataError, match="--objective dpo"):
        check_objective(tmp_path / "p", "sft")


def test_writer_refuses_a_row_longer_than_seq_len(tmp_path: Path, tokenizer: TokenizerInfo) -> None:
    with pytest.raises(DataError, match="row 0 holds 10 tokens, more than seq_len"):
        write_packed(
            tmp_path / "c",
            [[([1] * 10, [1] * 10)]],
            objective="sft",
            seq_len=8,
            tokenizer=tokenizer,
        )
    assert not list(tmp_path.iterdir())


def test_reader_names_the_fix(chat: str, tokenizer: TokenizerInfo, tmp_path: Path) -> None:
    os.replace(mask_path(chat), chat + ".moved")
    with pytest.raises(DataError, match=r"chat\.mask\.bin not found.*baton data prepare"):
        PackedDataset(chat)
    os.replace(chat + ".moved", mask_path(chat))
    with open(mask_path(chat), "ab") as stream:
        stream.write(b"\x01")
    with pytest.raises(DataError, match="has 13 bytes but .* holds 12 tokens"):
        PackedDataset(chat)
    with open(mask_path(chat), "rb+") as stream:
        stream.truncate(12)
    manifest_file = Path(chat + ".json")
    manifest = json.loads(manifest_file.read_text())
    manifest["seq_len"] = 7
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="row 0 holds 9 tokens, more than seq_len"):
        PackedDataset(chat)
    manifest["seq_len"], manifest["objective"] = 8, "pretrain"
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="describes pretraining text"):
        PackedDataset(chat)
    with pytest.raises(DataError, match="is pretraining text, but --objective sft"):
        check_objective(chat, "sft")
    check_objective(chat, "pretrain")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_indexed_writer_writes_megatron_builders_bytes(tmp_path: Path, dtype: type) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    documents = [([3, 4, 5, 6, 0, 7, 8, 0], [5, 3]), ([1], [1]), ([9] * 70_000, [40_000, 30_000])]
    ours = IndexedWriter(tmp_path / "ours.bin", dtype)
    theirs = IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=dtype)
    for tokens, lengths in documents:
        ours.add_document(np.array(tokens), lengths)
        theirs.add_document(np.array(tokens), lengths)
    ours.finalize(tmp_path / "ours.idx")
    theirs.finalize(str(tmp_path / "theirs.idx"))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (
            tmp_path / f"theirs{suffix}"
        ).read_bytes()
    read = IndexedDataset(str(tmp_path / "ours"))
    assert read.document_indices.tolist() == [0, 2, 3, 5]
    assert read[1].tolist() == [7, 8, 0]
