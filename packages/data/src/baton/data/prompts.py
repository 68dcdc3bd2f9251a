"""Prompts for online RL (GRPO): token ids, and the records they came from.

``baton data prepare PROMPTS.jsonl --tokenizer DIR --output PREFIX`` writes them (with
:func:`write_prompts`) from prompt-only records, TRL's format: ``{"prompt": ..., ...}``
where ``prompt`` is text or a list of turns and every other field is a *column* that
travels with the prompt to the reward functions. Four files:

* ``PREFIX.bin`` / ``PREFIX.idx``: Megatron's indexed dataset, one sequence (and one
  document) per prompt: its ids as the policy sees them (text tokenized with the
  tokenizer's own special tokens, turns rendered by the chat template with the generation
  prompt), no end-of-document token;
* ``PREFIX.prompts.jsonl``: one JSON object per prompt, ``{"prompt": <as given>,
  <column>: <value>, ...}``, every column in every record (null where a record had none);
* ``PREFIX.json``: the manifest (``format: "baton-prepared-data/2"``, ``objective:
  "prompts"``, the tokenizer's fingerprint, the chat template's, ``prompts``,
  ``max_prompt_length``, ``columns``, ...).

Example::

    from baton.data.prompts import PreparedPrompts

    prompts = PreparedPrompts("data/math")           # validated; DataError naming the fix
    len(prompts), prompts.max_prompt_length, prompts.columns    # 7473, 212, ["answer"]
    prompts.ids(0)                                   # np.ndarray of the prompt's ids
    prompts.record(0)                                # {"prompt": [...turns], "answer": "72"}
    prompts.for_rewards([4, 9], repeat=8)            # 16 prompts, {"answer": [16 values]}
    prompts.check_tokenizer(load_tokenizer("runs/tok"))   # DataError on another tokenizer
    prompts.check_prompt_length(256)                 # DataError: a prompt is longer

Writing them (the ids already tokenized; ``baton data prepare`` does it)::

    from baton.data.prompts import write_prompts

    manifest = write_prompts(
        "data/math", [[5, 6, 7], [5, 8]], [{"prompt": "2+2=", "answer": "4"}, ...],
        tokenizer=load_tokenizer("runs/tok"), columns=["answer"], conversational=False,
    )
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from baton.data.errors import DataError
from baton.data.indexed import PreparedDataset
from baton.data.indexed_writer import IndexedWriter
from baton.data.manifest import Manifest, check_tokenizer, manifest_path, split_prefix
from baton.data.packed import PACKED_FORMAT, read_packed_manifest, token_dtype
from baton.data.tokenizer import TokenizerInfo

#: the ``objective`` of a prompts manifest: the data kind ``--objective grpo`` reads
PROMPTS = "prompts"
#: names a column may not have: the reward functions' own arguments
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids")


def records_path(prefix: str | Path) -> Path:
    """``PREFIX.prompts.jsonl``: the prompts' records, one JSON object per line."""
    return Path(split_prefix(prefix) + ".prompts.jsonl")


def _how_to_make(prefix: str) -> str:
    return f"`baton data prepare PROMPTS.jsonl --tokenizer DIR --output {prefix}`"


class PreparedPrompts:
    """Prompts written by ``baton data prepare`` from prompt-only records, validated.

    Raises :class:`DataError` naming the fix for a prefix without prompts, data of
    another kind (text, conversations, pairs), a missing ``.prompts.jsonl`` and counts
    that disagree between the index, the records and the manifest.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = split_prefix(prefix)
        again = f"prepare them again with {_how_to_make(self.prefix)}"
        manifest = read_packed_manifest(self.prefix)
        if manifest is None:
            if Path(self.prefix + ".bin").exists():
                raise DataError(
                    f"{manifest_path(self.prefix)} not found: {self.prefix} is not prompts "
                    f"(or its manifest was lost); {again}"
                )
            raise DataError(
                f"no prompts at {self.prefix}; make them with {_how_to_make(self.prefix)}"
            )
        objective = manifest.get("objective")
        if manifest.get("format") != PACKED_FORMAT or objective != PROMPTS:
            kind = "pretraining text" if objective in (None, "pretrain") else f"{objective} data"
            raise DataError(
                f"{self.prefix} holds {kind}, not prompts: GRPO reads prompt-only records "
                f'({{"prompt": ...}}) prepared with {_how_to_make(self.prefix)}'
            )
        #: the manifest ``PREFIX.json``
        self.manifest: dict[str, Any] = manifest
        self.indexed = PreparedDataset(self.prefix)
        count = int(manifest.get("prompts", -1))
        if not (count == self.indexed.num_sequences == self.indexed.num_documents) or count < 1:
            raise DataError(
                f"{self.prefix}: the manifest counts {count} prompts but {self.prefix}.idx holds "
                f"{self.indexed.num_sequences} sequences in {self.indexed.num_documents} "
                f"documents; {again}"
            )
        #: the longest prompt, in tokens
        self.max_prompt_length: int = int(manifest.get("max_prompt_length", -1))
        longest = int(self.indexed.sequence_lengths.max())
        if longest != self.max_prompt_length:
            raise DataError(
                f"{self.prefix}: the manifest says the longest prompt has "
                f"{self.max_prompt_length} tokens, {self.prefix}.idx {longest}; {again}"
            )
        self._open_records(count, again)
        #: the fields of every record beside ``prompt``, in order
        self.columns: list[str] = [str(name) for name in manifest.get("columns", [])]
        #: the prompts are lists of turns (rendered by the chat template)
        self.conversational: bool = bool(manifest.get("conversational", False))
        #: ``{"source": ..., "sha256": ...}`` of the chat template, or None (text prompts)
        self.template: dict[str, str] | None = manifest.get("template")

    def _open_records(self, count: int, again: str) -> None:
        path = records_path(self.prefix)
        if not path.is_file():
            raise DataError(f"{path} not found (the records of {self.prefix}'s prompts); {again}")
        if path.stat().st_size == 0:
            raise DataError(f"{path} is empty but {self.prefix} has {count} prompts; {again}")
        data = np.memmap(path, mode="r", dtype=np.uint8)
        ends = np.flatnonzero(data == ord("\n")) + 1
        if len(ends) == 0 or int(ends[-1]) != len(data):
            ends = np.append(ends, len(data))  # a last line without its newline
        if len(ends) != count:
            raise DataError(
                f"{path} has {len(ends)} records but {self.prefix} has {count} prompts; {again}"
            )
        self._records = data
        self._starts = np.concatenate([[0], ends[:-1]])
        self._ends = ends

    def __len__(self) -> int:
        return self.indexed.num_sequences

    def _checked(self, index: int) -> int:
        if not 0 <= index < len(self):
            raise IndexError(f"prompt {index} out of range (0..{len(self) - 1})")
        return index

    def ids(self, index: int) -> np.ndarray:
        """The token ids of prompt ``index`` (a read-only view into ``.bin``)."""
        return self.indexed.get(self._checked(index))

    def length(self, index: int) -> int:
        """How many tokens prompt ``index`` has."""
        return int(self.indexed.sequence_lengths[self._checked(index)])

    def record(self, index: int) -> dict[str, Any]:
        """``{"prompt": <as given>, <column>: <value>, ...}`` of prompt ``index``."""
        start, end = int(self._starts[self._checked(index)]), int(self._ends[index])
        line = bytes(self._records[start:end])
        try:
            value = json.loads(line)
        except ValueError as error:
            raise DataError(
                f"{records_path(self.prefix)} line {index + 1} is not JSON ({error}); prepare "
                f"the prompts again with {_how_to_make(self.prefix)}"
            ) from None
        if not isinstance(value, dict) or "prompt" not in value:
            raise DataError(
                f"{records_path(self.prefix)} line {index + 1} is not a prompt's record; "
                f"prepare the prompts again with {_how_to_make(self.prefix)}"
            )
        return value

    def for_rewards(
        self, indices: Sequence[int], repeat: int = 1
    ) -> tuple[list[Any], dict[str, list[Any]]]:
        """``(prompts, columns)`` as reward functions take them for the completions of the
        prompts ``indices``, ``repeat`` completions each (in order: each prompt's
        ``repeat`` completions together): every prompt as given, every column's value."""
        records = [self.record(index) for index in indices]
        prompts = [record["prompt"] for record in records for _ in range(repeat)]
        columns = {
            name: [record.get(name) for record in records for _ in range(repeat)]
            for name in self.columns
        }
        return prompts, columns

    def check_tokenizer(self, tokenizer: TokenizerInfo) -> Manifest | None:
        """Raise :class:`DataError` if the prompts were prepared with another tokenizer."""
        return check_tokenizer(self.prefix, tokenizer)

    def check_prompt_length(self, limit: int, flag: str = "--max-prompt-length") -> None:
        """Raise :class:`DataError` if a prompt has more than ``limit`` tokens (free: the
        manifest knows the longest)."""
        if self.max_prompt_length <= limit:
            return
        lengths = np.asarray(self.indexed.sequence_lengths)
        longer = int((lengths > limit).sum())
        first = int(np.argmax(lengths > limit))
        raise DataError(
            f"{longer} of {len(self)} prompts of {self.prefix} are longer than {flag} "
            f"{limit} (the longest: {self.max_prompt_length} tokens; the first: prompt "
            f"{first}, {int(lengths[first])} tokens); pass {flag} {self.max_prompt_length}, "
            "or shorten those prompts and prepare them again"
        )

    def __repr__(self) -> str:
        return (
            f"PreparedPrompts({self.prefix!r}: {len(self)} prompts, the longest "
            f"{self.max_prompt_length} tokens, columns {self.columns})"
        )


# ---- the writer ----------------------------------------------------------------------


def _json_line(record: Mapping[str, Any], number: int) -> str:
    try:
        return json.dumps(record, ensure_ascii=False) + "\n"
    except (TypeError, ValueError):
        pass
    for key, value in record.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise DataError(
                f"prompt {number}: {key!r} holds a {type(value).__name__}, which JSON cannot "
                "hold; convert it to text, numbers, lists or tables"
            ) from None
    raise DataError(f"prompt {number} cannot be written as JSON; fix the record")


def _check_prompts(
    ids: Sequence[Sequence[int]],
    records: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    vocab_size: int,
) -> None:
    if not ids:
        raise DataError("no prompts to write")
    if len(ids) != len(records):
        raise DataError(f"{len(ids)} prompts' ids but {len(records)} records; give one each")
    reserved = [name for name in columns if name in (*RESERVED_COLUMNS, "prompt")]
    if reserved:
        raise DataError(
            f"column {reserved[0]!r} has the name of a reward function's own argument; rename "
            "it in the data"
        )
    for number, (tokens, record) in enumerate(zip(ids, records, strict=True)):
        if len(tokens) == 0:
            raise DataError(f"prompt {number} has no tokens; drop it or fill it in")
        if max(tokens) >= vocab_size or min(tokens) < 0:
            raise DataError(
                f"prompt {number} holds token id {max(tokens)}, outside the tokenizer's "
                f"{vocab_size} ids"
            )
        if "prompt" not in record:
            raise DataError(f"record {number} has no 'prompt' (its fields: {sorted(record)})")


def write_prompts(
    prefix: str | Path,
    ids: Sequence[Sequence[int]],
    records: Sequence[Mapping[str, Any]],
    *,
    tokenizer: TokenizerInfo,
    columns: Sequence[str],
    conversational: bool,
    template: Mapping[str, str] | None = None,
    **manifest_fields: Any,
) -> dict[str, Any]:
    """Write ``PREFIX.bin/.idx/.prompts.jsonl/.json`` and return the manifest.

    ``ids[i]`` are prompt ``i``'s tokens, ``records[i]`` its ``{"prompt": ..., column:
    value}`` (a column a record lacks is written null, a field that is no column is left
    out). ``manifest_fields`` (``sources``,
    ``input_format``, ...) are recorded as given. Raises :class:`DataError` (nothing
    written) for no prompts, a prompt without tokens or with an id outside the
    vocabulary, a column named as a reward function's argument, or a value JSON cannot
    hold. Files are written under temporary names and renamed, the index last.
    """
    _check_prompts(ids, records, columns, tokenizer.vocab_size)
    lines = [
        _json_line({"prompt": record["prompt"], **{c: record.get(c) for c in columns}}, number)
        for number, record in enumerate(records)
    ]
    prefix = split_prefix(prefix)
    finals = {
        "bin": Path(prefix + ".bin"),
        "records": records_path(prefix),
        "json": manifest_path(prefix),
        "idx": Path(prefix + ".idx"),
    }
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    temporaries = {kind: Path(f"{path}.partial-{os.getpid()}") for kind, path in finals.items()}
    lengths = [len(tokens) for tokens in ids]
    dtype = token_dtype(tokenizer.vocab_size)
    manifest: dict[str, Any] = {
        "format": PACKED_FORMAT,
        "objective": PROMPTS,
        "tokenizer": {
            "fingerprint": tokenizer.fingerprint,
            "path": str(tokenizer.path),
            "vocab_size": tokenizer.vocab_size,
            "eod_token": tokenizer.eod_token,
            "eod_id": tokenizer.eod_id,
        },
        "dtype": dtype.name,
        "prompts": len(ids),
        "documents": len(ids),
        "tokens": sum(lengths),
        "max_prompt_length": max(lengths),
        "columns": list(columns),
        "conversational": conversational,
        "template": dict(template) if template is not None else None,
        "sources": [],
        "skipped_empty_documents": 0,
        "text_key": None,
    }
    manifest.update(manifest_fields)
    try:
        with IndexedWriter(temporaries["bin"], dtype) as builder:
            for tokens in ids:
                builder.add_document(np.asarray(tokens, dtype=dtype), [len(tokens)])
        builder.finalize(str(temporaries["idx"]))
        temporaries["records"].write_text("".join(lines), encoding="utf-8")
        temporaries["json"].write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        for path in temporaries.values():  # on disk before the renames make them visible
            with open(path, "rb+") as stream:
                os.fsync(stream.fileno())
        finals["idx"].unlink(missing_ok=True)  # no old index pairs the new files meanwhile
        for kind in ("bin", "records", "json", "idx"):
            os.replace(temporaries[kind], finals[kind])
        return manifest
    finally:
        for path in temporaries.values():
            path.unlink(missing_ok=True)
