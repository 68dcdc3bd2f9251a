"""Post-training data: tokenized conversations (or preference pairs) packed into rows.

``baton data prepare --seq-len N`` writes it (with :func:`write_packed`): Megatron's
indexed dataset ``PREFIX.bin``/``PREFIX.idx`` (the bytes megatron-core's builder writes)
whose *sequences*
are the documents (one conversation, or one side of a preference pair) and whose
*documents* are the packed rows, a mask file ``PREFIX.mask.bin`` (``uint8``, one byte per
token: 1 where the token is a supervised target) and the manifest ``PREFIX.json``
(``format: "baton-prepared-data/2"``, ``objective: "sft" | "preference"``, ``seq_len``...).
A row holds at most ``seq_len + 1`` tokens, so it gives ``seq_len`` inputs and targets.
Preference pairs are two consecutive documents of one row: chosen, then rejected.

Example::

    from baton.data.packed import PackedDataset, check_objective

    check_objective("data/chat", "sft")          # DataError naming the fix otherwise
    data = PackedDataset("data/chat")            # validated, memory-mapped
    data.objective, data.seq_len, data.num_rows, data.max_documents_per_row
    data.row(3)                                  # [(tokens, mask), ...] one per document
    batch = data.batch([0, 1, 2, 3], pad_id=0)   # PackedBatch of [4, seq_len] arrays
    batch.inputs, batch.targets, batch.loss_mask, batch.positions, batch.segments
    batch.documents                              # [4, max_documents_per_row] sequence ids
    batch.supervised_tokens                      # loss_mask.sum()

Held-out rows (``--eval-split F``: the last rows; or ``--eval-data-path``: another
prepared dataset of the same kind), the one rule of every engine: nothing is held out
unless asked::

    train, held = held_out_rows(data, "sft", eval_split=0.25)   # two views of the same files
    train.num_rows, held.num_rows, held.whole is data           # 6, 2, True
    train, held = held_out_rows(data, "sft", eval_data_path="data/chat_eval")
    train, held = held_out_rows(data, "sft")                    # (data, None): every row trains
    train, held = split_rows(data, 0.25)                        # the split alone

Writing rows of ``(tokens, mask)`` documents (a row holds at most ``seq_len + 1`` tokens;
preference rows hold whole pairs, chosen first)::

    from baton.data import load_tokenizer
    from baton.data.packed import write_packed

    rows = [
        [([5, 6, 7, 0], [0, 0, 1, 1]), ([5, 8, 0], [0, 1, 1])],
        [([5, 9, 9, 9, 0], [0, 0, 1, 1, 1])],
    ]
    manifest = write_packed(
        "data/chat", rows, objective="sft", seq_len=8, tokenizer=load_tokenizer("tok"),
        input_format="messages", mask="assistant",
    )
    manifest["packing"]["fill"]     # non-padding fraction of the rows' seq_len + 1 tokens

GRPO's prompts are data of a kind of their own (``objective: "prompts"``, not rows):
:mod:`baton.data.prompts`; :func:`check_objective` tells every kind apart.

Attention never crosses documents: positions restart at 0 in each document and query
``i`` may see key ``j`` iff ``j <= i`` and ``segments[i] == segments[j] > 0``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from baton.core.objectives import DataKind, objective_named
from baton.core.objectives.registry import objective_reading
from baton.data.errors import DataError
from baton.data.indexed import PreparedDataset
from baton.data.indexed_writer import IndexedWriter
from baton.data.manifest import manifest_path, split_prefix
from baton.data.split import held_out_start
from baton.data.tokenizer import TokenizerInfo

#: the ``format`` of a post-training manifest
PACKED_FORMAT = "baton-prepared-data/2"
#: the kinds of packed post-training data (``DataKind`` values: the manifest's ``objective``)
OBJECTIVES = (DataKind.CONVERSATIONS.value, DataKind.PAIRS.value)
#: how each kind of data is made, for messages
MADE_BY = {
    DataKind.CONVERSATIONS: "conversations packed with `baton data prepare ... --seq-len N`",
    DataKind.PAIRS: "preference pairs packed with `baton data prepare ... --seq-len N`",
    DataKind.PROMPTS: 'prompt-only records ({"prompt": ...}) prepared with `baton data prepare '
    "PROMPTS.jsonl --tokenizer DIR --output PREFIX`",
    DataKind.TEXT: "pretraining text",
}


def mask_path(prefix: str | Path) -> Path:
    """``PREFIX.mask.bin``: one ``uint8`` per token of ``PREFIX.bin``."""
    return Path(split_prefix(prefix) + ".mask.bin")


def read_packed_manifest(prefix: str | Path) -> dict[str, Any] | None:
    """The JSON content of ``PREFIX.json``, or None if there is none."""
    path = manifest_path(prefix)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is not valid JSON ({error}); prepare the data again") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is not a baton data manifest; prepare the data again")
    return data


def data_objective(prefix: str | Path) -> str:
    """What the data at ``prefix`` is: ``"pretrain"``, ``"sft"``, ``"preference"`` or
    ``"prompts"``.

    Data without a manifest (prepared by other tools) is pretraining text.
    """
    manifest = read_packed_manifest(prefix)
    if manifest is None:
        return "pretrain"
    return str(manifest.get("objective", "pretrain"))


def check_objective(prefix: str | Path, objective: str) -> None:
    """Raise :class:`DataError` unless the data at ``prefix`` is the kind the training
    ``objective`` reads (its declaration's ``data``); the message names the fix."""
    wanted = objective_named(objective).data
    found = data_objective(prefix)
    if found == wanted.value:
        return
    name = split_prefix(prefix)
    if found == DataKind.TEXT.value:
        raise DataError(
            f"{name} is pretraining text, but --objective {objective} needs {MADE_BY[wanted]}; "
            "prepare them, or train with --objective pretrain"
        )
    reads = objective_reading(DataKind(found)) if found in set(DataKind) else None
    matching = reads.name if reads is not None else found
    if DataKind.PROMPTS.value in (found, wanted.value):  # prompts: a kind of their own
        raise DataError(
            f"{name} holds {found} data (prepared for --objective {matching}), but "
            f"--objective {objective} reads {MADE_BY[wanted]}; pass --objective {matching}, "
            "or prepare that data"
        )
    raise DataError(
        f"{name} holds {found} data (prepared for --objective {matching}), not data for "
        f"--objective {objective}; pass --objective {matching}, or prepare data for "
        f"{objective}"
    )


@dataclass(frozen=True)
class PackedBatch:
    """Rows of a :class:`PackedDataset` as ``[B, seq_len]`` numpy arrays.

    ``inputs``/``targets`` (int64) are each row's tokens without its last / first token,
    padded with ``pad_id``. ``loss_mask`` (bool) is True where the target is supervised:
    never on padding nor at a document's first token (no loss crosses documents).
    ``positions`` (int32) restart at 0 in each document; ``segments`` (int32) number the
    documents of a row 1..k, 0 on padding. ``documents`` (int64, ``[B,
    max_documents_per_row]``) is the global sequence index of segment ``d + 1`` of row
    ``b``, -1 where the row has fewer documents.
    """

    inputs: np.ndarray
    targets: np.ndarray
    loss_mask: np.ndarray
    positions: np.ndarray
    segments: np.ndarray
    documents: np.ndarray

    @property
    def supervised_tokens(self) -> int:
        return int(self.loss_mask.sum())


class PackedDataset:
    """A post-training dataset written by ``baton data prepare --seq-len N``, validated.

    Raises :class:`DataError` naming the fix for a missing manifest, mask file or index,
    a manifest of pretraining data or of another format, a mask file or index whose size
    disagrees with the data, or a row longer than ``seq_len + 1`` tokens.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = split_prefix(prefix)
        manifest = read_packed_manifest(self.prefix)
        redo = f"prepare it again with `baton data prepare ... --seq-len N --output {self.prefix}`"
        if manifest is None:
            if Path(self.prefix + ".bin").exists():
                raise DataError(
                    f"{manifest_path(self.prefix)} not found: {self.prefix} is not "
                    f"post-training data (or its manifest was lost); {redo}"
                )
            raise DataError(
                f"no post-training data at {self.prefix}; make it with `baton data prepare "
                f"INPUT --tokenizer DIR --seq-len N --output {self.prefix}`"
            )
        objective = manifest.get("objective")
        if manifest.get("format") != PACKED_FORMAT or objective not in OBJECTIVES:
            kind = "pretraining text" if objective in (None, "pretrain") else repr(objective)
            raise DataError(
                f"{manifest_path(self.prefix)} describes {kind} (format "
                f"{manifest.get('format')!r}), not conversations or preference pairs packed "
                f"for post-training; {redo}, or train with --objective pretrain"
            )
        self.manifest: dict[str, Any] = manifest
        #: the dataset a view of rows (``rows``) was cut from (``self`` for a whole one)
        self.whole: PackedDataset = self
        #: the first row of ``whole`` this dataset's row 0 is
        self.first_row = 0
        self.objective: str = str(objective)
        self.seq_len: int = int(manifest["seq_len"])
        self.indexed = PreparedDataset(self.prefix)
        self._check_mask(redo)
        self._check_rows(redo)

    def _check_mask(self, redo: str) -> None:
        path = mask_path(self.prefix)
        if not path.is_file():
            raise DataError(f"{path} not found (the loss mask of {self.prefix}); {redo}")
        size = path.stat().st_size
        if size != self.indexed.num_tokens:
            raise DataError(
                f"{path} has {size} bytes but {self.prefix}.bin holds {self.indexed.num_tokens} "
                f"tokens (one mask byte each); {redo}"
            )
        if size == 0:
            raise DataError(f"{self.prefix} holds no tokens; {redo}")
        #: one byte per token, 1 where the token is a supervised target
        self.mask: np.ndarray = np.memmap(path, mode="r", dtype=np.uint8)

    def _check_rows(self, redo: str) -> None:
        bounds = np.asarray(self.indexed.document_indices, dtype=np.int64)
        lengths = np.asarray(self.indexed.sequence_lengths, dtype=np.int64)
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != len(lengths):
            raise DataError(f"{self.prefix}.idx has no valid rows; {redo}")
        per_row = np.diff(bounds)
        if (per_row <= 0).any():
            raise DataError(f"{self.prefix}.idx has an empty row; {redo}")
        starts = np.concatenate([[0], np.cumsum(lengths)])
        row_tokens = starts[bounds[1:]] - starts[bounds[:-1]]
        longest = int(row_tokens.max())
        if longest > self.seq_len + 1:
            raise DataError(
                f"{self.prefix}: row {int(row_tokens.argmax())} holds {longest} tokens, more "
                f"than seq_len + 1 = {self.seq_len + 1} (the manifest's seq_len); {redo}"
            )
        if self.objective == "preference" and (per_row % 2).any():
            raise DataError(
                f"{self.prefix}: row {int(np.argmax(per_row % 2))} holds an odd number of "
                f"documents, so a preference pair is split; {redo}"
            )
        expected = int(self.manifest.get("max_documents_per_row", per_row.max()))
        if int(per_row.max()) != expected:
            raise DataError(
                f"{self.prefix}: rows hold up to {int(per_row.max())} documents, the manifest "
                f"says {expected}; {redo}"
            )
        self._row_bounds = bounds
        self._token_starts = starts
        #: documents in each row
        self.documents_per_row: np.ndarray = per_row
        self.max_documents_per_row: int = int(per_row.max())

    @property
    def num_rows(self) -> int:
        return len(self._row_bounds) - 1

    def rows(self, start: int, stop: int) -> PackedDataset:
        """Rows ``start .. stop - 1`` as a dataset of their own: the same files, its row 0
        this one's row ``start``; documents keep their global sequence numbers (a DPO
        reference over ``whole`` still applies), ``max_documents_per_row`` stays the
        whole's."""
        if not 0 <= start < stop <= self.num_rows:
            raise IndexError(f"rows {start}..{stop - 1} out of range (0..{self.num_rows - 1})")
        view = copy.copy(self)
        view._row_bounds = self._row_bounds[start : stop + 1]
        view.documents_per_row = self.documents_per_row[start:stop]
        view.first_row = self.first_row + start
        return view

    @property
    def sequences(self) -> range:
        """The global sequence numbers of this dataset's documents."""
        return range(int(self._row_bounds[0]), int(self._row_bounds[-1]))

    @property
    def num_sequences(self) -> int:
        """Documents over all rows (conversations, or two per preference pair)."""
        return self.indexed.num_sequences

    def __len__(self) -> int:
        return self.num_rows

    def document(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, mask)`` of global sequence ``index`` (read-only views)."""
        start, end = int(self._token_starts[index]), int(self._token_starts[index + 1])
        return self.indexed.tokens[start:end], self.mask[start:end]

    def row(self, index: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(tokens, mask), ...]``: the documents of row ``index`` in order."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"row {index} out of range (0..{self.num_rows - 1})")
        first, end = int(self._row_bounds[index]), int(self._row_bounds[index + 1])
        return [self.document(sequence) for sequence in range(first, end)]

    def batch(self, rows: Sequence[int], pad_id: int = 0) -> PackedBatch:
        """Rows ``rows`` as one :class:`PackedBatch` of ``[len(rows), seq_len]`` arrays."""
        size, width = len(rows), self.seq_len
        inputs = np.full((size, width), pad_id, dtype=np.int64)
        targets = np.full((size, width), pad_id, dtype=np.int64)
        loss_mask = np.zeros((size, width), dtype=bool)
        positions = np.zeros((size, width), dtype=np.int32)
        segments = np.zeros((size, width), dtype=np.int32)
        documents = np.full((size, self.max_documents_per_row), -1, dtype=np.int64)
        for b, index in enumerate(rows):
            if not 0 <= index < self.num_rows:
                raise IndexError(f"row {index} out of range (0..{self.num_rows - 1})")
            first, end = int(self._row_bounds[index]), int(self._row_bounds[index + 1])
            start, stop = int(self._token_starts[first]), int(self._token_starts[end])
            tokens = np.asarray(self.indexed.tokens[start:stop], dtype=np.int64)
            mask = np.asarray(self.mask[start:stop], dtype=bool)
            lengths = np.diff(self._token_starts[first : end + 1])
            segment = np.repeat(np.arange(1, end - first + 1, dtype=np.int32), lengths)
            document_start = np.repeat(np.cumsum(lengths) - lengths, lengths)
            position = (np.arange(len(tokens)) - document_start).astype(np.int32)
            n = len(tokens) - 1
            inputs[b, :n] = tokens[:-1]
            targets[b, :n] = tokens[1:]
            # a target is supervised only inside the document of its input
            loss_mask[b, :n] = mask[1:] & (segment[1:] == segment[:-1])
            positions[b, :n] = position[:-1]
            segments[b, :n] = segment[:-1]
            documents[b, : end - first] = np.arange(first, end)
        return PackedBatch(inputs, targets, loss_mask, positions, segments, documents)

    def __repr__(self) -> str:
        part = "" if self.whole is self else f" from row {self.first_row}"
        return (
            f"PackedDataset({self.prefix!r}: {self.objective}, {self.num_rows} rows{part} of "
            f"{self.seq_len + 1} tokens, {self.num_sequences} documents)"
        )


def held_out_rows(
    data: PackedDataset,
    objective: str,
    *,
    eval_split: float = 0.0,
    eval_data_path: str | None = None,
) -> tuple[PackedDataset, PackedDataset | None]:
    """``(rows to train on, rows to evaluate on)`` of a run of the training
    ``objective`` on ``data``: with ``eval_split`` the last ``eval_split`` of the rows are
    held out (``held_out_start``, the rule of every engine: at least one, never all); with
    ``eval_data_path`` that prepared dataset is evaluated and every row trains; with
    neither every row trains and there is nothing to evaluate (``None``). Held-out data
    of a kind ``objective`` does not read, another row width or tokenizer, or both flags
    at once, is a ``DataError`` naming the fix."""
    if eval_split and eval_data_path is not None:
        raise DataError(
            "pass --eval-split F (the last rows of --data-path) or --eval-data-path PREFIX "
            "(other prepared data), not both"
        )
    if eval_data_path is not None:
        check_objective(eval_data_path, objective)
        held = PackedDataset(eval_data_path)
        ours, theirs = data.manifest["tokenizer"], held.manifest["tokenizer"]
        if theirs.get("fingerprint") != ours.get("fingerprint"):
            raise DataError(
                f"--eval-data-path {held.prefix} was prepared with another tokenizer than "
                f"{data.prefix}; prepare it with {ours.get('path')}"
            )
        if held.seq_len != data.seq_len:
            raise DataError(
                f"--eval-data-path {held.prefix} holds rows of {held.seq_len} tokens, "
                f"{data.prefix} of {data.seq_len}; prepare it with --seq-len {data.seq_len}"
            )
        return data, held
    return split_rows(data, eval_split)


def split_rows(
    data: PackedDataset, eval_split: float
) -> tuple[PackedDataset, PackedDataset | None]:
    """``(the rows before the last eval_split of them, those last rows)`` (``(data,
    None)`` for 0); a ``DataError`` when none would be left to train on."""
    if not eval_split:
        return data, None
    rows = data.num_rows
    if 0 <= eval_split < 1 and max(1, round(eval_split * rows)) >= rows:
        raise DataError(
            f"{data.prefix} holds {rows} packed row(s): holding out {eval_split} of them "
            "leaves none to train on; use more data or a smaller --eval-split"
        )
    first = held_out_start(rows, eval_split, source=data.prefix)
    return data.rows(0, first), data.rows(first, rows)


# ---- the writer ----------------------------------------------------------------------

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


def token_dtype(vocab_size: int) -> np.dtype:
    """The token dtype of ``.bin`` for a vocabulary of ``vocab_size`` ids."""
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
    dtype = token_dtype(tokenizer.vocab_size)
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
    # every row's tokens and mask values in one array each (one conversion, not one per
    # document), then cut into rows for the index
    lengths = np.fromiter((len(tokens) for row in rows for tokens, _ in row), dtype=np.int64)
    tokens_total = int(lengths.sum())
    flat = np.fromiter(
        chain.from_iterable(tokens for row in rows for tokens, _ in row),
        dtype=dtype,
        count=tokens_total,
    )
    mask = np.fromiter(
        chain.from_iterable(flags for row in rows for _, flags in row),
        dtype=np.uint8,
        count=tokens_total,
    )
    mask = (mask != 0).astype(np.uint8)
    mask[np.cumsum(lengths) - lengths] = 0  # nothing predicts a first token
    supervised = int(mask.sum())
    documents = len(lengths)
    builder = IndexedWriter(temporaries["bin"], dtype)
    try:
        start = first = 0
        for row in rows:
            count = len(row)
            row_lengths = lengths[first : first + count]
            end = start + int(row_lengths.sum())
            builder.add_document(flat[start:end], row_lengths.tolist())
            start, first = end, first + count
        with open(temporaries["mask"], "wb") as masks:
            masks.write(mask.tobytes())
    finally:
        builder.close()
    builder.finalize(str(temporaries["idx"]))
    packing: dict[str, Any] = dict(manifest_fields.pop("packing", None) or {"method": "given"})
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
