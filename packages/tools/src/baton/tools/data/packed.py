"""Write post-training data: rows of tokenized documents with their loss masks.

The writer of what :class:`baton.data.packed.PackedDataset` reads. It lives with the
tools because it writes through megatron-core's ``IndexedDatasetBuilder`` (torch), which
the numpy-only ``baton.data`` does not import.

Example::

    from baton.data import load_tokenizer
    from baton.tools.data.packed import write_packed

    rows = [  # a row is a list of documents; a document is (tokens, mask)
        [([5, 6, 7, 0], [0, 0, 1, 1]), ([5, 8, 0], [0, 1, 1])],
        [([5, 9, 9, 9, 0], [0, 0, 1, 1, 1])],
    ]
    manifest = write_packed(
        "data/chat", rows, objective="sft", seq_len=8, tokenizer=load_tokenizer("tok"),
        input_format="messages", mask="assistant",
    )
    manifest["packing"]["fill"]     # non-padding fraction of the rows' seq_len + 1 tokens

Every row holds at most ``seq_len + 1`` tokens; preference rows hold pairs (chosen, then
rejected). Megatron's *sequences* are the documents, its *documents* the rows. The first
token of every document gets mask 0 (nothing in the document predicts it). Everything is
written under temporary names and renamed at the end, ``PREFIX.idx`` last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from baton.data import DataError, TokenizerInfo, manifest_path, split_prefix
from baton.data.packed import OBJECTIVES, PACKED_FORMAT, mask_path
from baton.tools.data.prepare import indexed_builder

#: a document: its token ids and one 0/1 mask value per token
Document = tuple[Sequence[int], Sequence[int]]


def _check_rows(
    rows: Sequence[Sequence[Document]], objective: str, seq_len: int, vocab_size: int
) -> None:
    if objective not in OBJECTIVES:
        raise DataError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if seq_len < 1:
        raise DataError(f"seq_len must be at least 1, not {seq_len}")
    if not rows:
        raise DataError("no rows to write: the data holds no documents")
    for number, row in enumerate(rows):
        if not row:
            raise DataError(f"row {number} holds no document")
        if objective == "preference" and len(row) % 2:
            raise DataError(
                f"row {number} holds {len(row)} documents: preference rows hold whole pairs "
                "(chosen, rejected)"
            )
        total = 0
        for tokens, mask in row:
            if len(tokens) == 0 or len(tokens) != len(mask):
                raise DataError(
                    f"row {number}: a document of {len(tokens)} tokens has {len(mask)} mask "
                    "values; give one per token, and at least one token"
                )
            total += len(tokens)
        if total > seq_len + 1:
            raise DataError(
                f"row {number} holds {total} tokens, more than seq_len + 1 = {seq_len + 1}"
            )
        for tokens, _ in row:
            largest = max(tokens)
            if largest >= vocab_size or min(tokens) < 0:
                raise DataError(
                    f"row {number} holds token id {largest}, outside the tokenizer's "
                    f"{vocab_size} ids"
                )


def _dtype(vocab_size: int) -> np.dtype:
    # megatron.core.datasets.indexed_dataset.DType.optimal_dtype, without importing torch
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def write_packed(
    prefix: str | Path,
    rows: Sequence[Sequence[Document]],
    *,
    objective: str,
    seq_len: int,
    tokenizer: TokenizerInfo,
    **manifest_fields: Any,
) -> dict[str, Any]:
    """Write ``rows`` to ``PREFIX.bin/.idx/.mask.bin/.json`` and return the manifest.

    ``manifest_fields`` (``input_format``, ``template``, ``mask``, ``packing``,
    ``sources``, ...) are recorded in the manifest as given, except that ``packing``
    gains the row count and the fill computed here. Raises :class:`DataError` (nothing
    written) for a row longer than ``seq_len + 1`` tokens, an empty row or document, a
    mask of another length than its tokens, an id outside the vocabulary, or a
    preference row holding half a pair.
    """
    _check_rows(rows, objective, seq_len, tokenizer.vocab_size)
    prefix = split_prefix(prefix)
    dtype = _dtype(tokenizer.vocab_size)
    finals = {
        "bin": Path(prefix + ".bin"),
        "mask": mask_path(prefix),
        "json": manifest_path(prefix),
        "idx": Path(prefix + ".idx"),
    }
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    temporaries = {kind: Path(f"{path}.partial-{os.getpid()}") for kind, path in finals.items()}
    try:
        manifest = _write(rows, objective, seq_len, tokenizer, dtype, temporaries, manifest_fields)
        finals["idx"].unlink(missing_ok=True)  # no old index pairs the new files meanwhile
        for kind in ("bin", "mask", "json", "idx"):
            os.replace(temporaries[kind], finals[kind])
        return manifest
    finally:
        for path in temporaries.values():
            path.unlink(missing_ok=True)


def _write(
    rows: Sequence[Sequence[Document]],
    objective: str,
    seq_len: int,
    tokenizer: TokenizerInfo,
    dtype: np.dtype,
    temporaries: dict[str, Path],
    manifest_fields: dict[str, Any],
) -> dict[str, Any]:
    builder = indexed_builder(temporaries["bin"], dtype)
    tokens_total = supervised = documents = 0
    try:
        with open(temporaries["mask"], "wb") as masks:
            for row in rows:
                lengths = [len(tokens) for tokens, _ in row]
                flat = np.concatenate([np.asarray(tokens, dtype=dtype) for tokens, _ in row])
                mask = np.concatenate([np.asarray(mask, dtype=np.uint8) for _, mask in row])
                mask = (mask != 0).astype(np.uint8)
                mask[np.cumsum(lengths) - lengths] = 0  # nothing predicts a first token
                builder.add_document(flat, lengths)
                masks.write(mask.tobytes())
                tokens_total += len(flat)
                supervised += int(mask.sum())
                documents += len(row)
    finally:
        builder.data_file.close()
    builder.finalize(str(temporaries["idx"]))
    packing = dict(manifest_fields.pop("packing", None) or {"method": "given"})
    packing.update(rows=len(rows), fill=tokens_total / (len(rows) * (seq_len + 1)))
    manifest: dict[str, Any] = {
        "format": PACKED_FORMAT,
        "objective": objective,
        "tokenizer": {
            "fingerprint": tokenizer.fingerprint,
            "path": str(tokenizer.path),
            "vocab_size": tokenizer.vocab_size,
            "eod_token": tokenizer.eod_token,
            "eod_id": tokenizer.eod_id,
        },
        "dtype": dtype.name,
        "documents": documents,
        "tokens": tokens_total,
        "supervised_tokens": supervised,
        "rows": len(rows),
        "seq_len": seq_len,
        "max_documents_per_row": max(len(row) for row in rows),
        "packing": packing,
        "sources": [],
        "skipped_empty_documents": 0,
        "text_key": None,
    }
    manifest.update(manifest_fields)
    temporaries["json"].write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    for path in temporaries.values():  # on disk before the renames make them visible
        with open(path, "rb+") as stream:
            os.fsync(stream.fileno())
    return manifest
