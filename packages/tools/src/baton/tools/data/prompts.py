"""``baton data prepare`` on prompt-only records: GRPO's prompts, tokenized as TRL does.

Example::

    from baton.tools.data.prompts import prepare_prompts

    manifest = prepare_prompts(["math.jsonl"], "runs/tok", "data/math")
    manifest["prompts"], manifest["max_prompt_length"], manifest["columns"]   # 7473, 212, ["answer"]

A record is ``{"prompt": ..., <column>: ..., ...}`` (TRL's prompt-only format): the
prompt is text or a list of turns, and every other field is a column that travels with
it to the reward functions (a record without one of them gets null). JSON Lines, Parquet
and a directory saved by ``datasets`` are read (:mod:`baton.tools.data.sources`).

Every record is read and checked first (before ``transformers`` is imported), then the
prompts are tokenized as TRL's ``GRPOTrainer._tokenize_prompts`` tokenizes them
(:meth:`~baton.tools.data.chat.ChatTokenizer.prompts`): text with the tokenizer's own
special tokens, turns rendered by the chat template with the generation prompt. Then
:func:`~baton.data.prompts.write_prompts` writes ``PREFIX.bin/.idx/.prompts.jsonl/.json``.
Bad input raises :class:`DataError` and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from baton.data import DataError, load_tokenizer, manifest_path, split_prefix
from baton.data.prompts import RESERVED_COLUMNS, records_path, write_prompts
from baton.tools.data.chat import ChatTokenizer
from baton.tools.data.formats import ANSWERS, check_record, is_conversational, record_format
from baton.tools.data.sources import Source, open_sources

#: prompts tokenized together (one batched call)
CHUNK = 512


def _rows(sources: Sequence[Source]) -> Iterator[tuple[Source, str, dict[str, Any]]]:
    for source in sources:
        for where, record in source.records():
            yield source, where, record


def _columns(record: dict[str, Any], columns: dict[str, None], where: str) -> None:
    """Add the record's columns to ``columns`` (in order of first appearance)."""
    for key in record:
        if key == "prompt" or (key in ANSWERS and record[key] is None):
            continue  # a format's field that a Parquet row or a saved dataset holds as null
        if key in RESERVED_COLUMNS:
            raise DataError(
                f"{where}: the column {key!r} has the name of a reward function's own "
                "argument; rename it"
            )
        columns.setdefault(str(key), None)


def read_prompts(
    sources: Sequence[Source], forced: str | None = None
) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """``(records, columns, per-source counts)``: every record checked as a prompt, all of
    one kind (text or turns)."""
    records: list[dict[str, Any]] = []
    columns: dict[str, None] = {}
    counts: dict[Path, dict[str, Any]] = {}
    first: tuple[str, bool] | None = None
    if forced not in (None, "prompt"):
        raise DataError(f"--format {forced} is not prompts; leave --format out, or pass --seq-len")
    for source, where, record in _rows(sources):
        fmt = forced or record_format(record, where)
        if fmt != "prompt":
            raise DataError(
                f"{where} is {fmt}, not a prompt alone: prompts (for GRPO) hold a 'prompt' "
                "and columns of your own; prepare each format on its own"
            )
        check_record(record, "prompt", where)
        conversational = is_conversational(record["prompt"])
        if first is None:
            first = (where, conversational)
        elif conversational != first[1]:
            kinds = ("a list of turns", "text") if conversational else ("text", "a list of turns")
            raise DataError(
                f"{where}: the prompt is {kinds[0]} but at {first[0]} it is {kinds[1]}; give "
                "every prompt as text or every prompt as turns"
            )
        _columns(record, columns, where)
        records.append(record)
        count = counts.setdefault(
            source.path, {"path": str(source.path), "bytes": source.size, "documents": 0}
        )
        count["documents"] += 1
    if not records:
        names = ", ".join(str(source.path) for source in sources)
        raise DataError(f"no records in {names}; check the files")
    return records, list(columns), list(counts.values())


def _tokenize(chat: ChatTokenizer, records: list[dict[str, Any]]) -> list[list[int]]:
    """Each record's prompt ids, :data:`CHUNK` at a time; a chunk that fails is done again
    prompt by prompt, so the error names the first record that fails."""
    ids: list[list[int]] = []
    for start in range(0, len(records), CHUNK):
        prompts = [record["prompt"] for record in records[start : start + CHUNK]]
        try:
            ids += chat.prompts(prompts)
        except DataError:
            for number, prompt in enumerate(prompts, start=start):
                try:
                    chat.prompts([prompt])
                except DataError as error:
                    raise DataError(f"prompt {number}: {error}") from None
            raise
    return ids


def prepare_prompts(
    inputs: Sequence[str | Path],
    tokenizer: str | Path,
    output: str | Path,
    *,
    chat_template: str | Path | None = None,
    input_format: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Tokenize the prompts of ``inputs`` into ``output`` (a prefix); return the manifest.

    ``input_format="prompt"`` takes every record's ``prompt`` as a prompt whatever its
    other fields (a ``completion`` becomes a column); by default a record with a
    completion, a pair or messages is refused.

    Raises :class:`DataError`, with nothing written, for any bad input: a record that is
    not a prompt alone, an empty prompt, turns out of order, text and turns mixed, a
    conversational prompt and no chat template, a column named ``prompts``,
    ``completions`` or ``completion_ids`` (the reward functions' own arguments).
    """
    from baton.tools.data.prepare import check_output

    name = split_prefix(output)
    files = [Path(name + ".bin"), Path(name + ".idx"), records_path(name), manifest_path(name)]
    prefix = check_output(output, force, files)
    info = load_tokenizer(tokenizer)
    sources = open_sources(inputs)
    for source in sources:
        if source.kind == "txt":
            raise DataError(
                f"{source.path} is plain text; prompts come as .jsonl, .parquet or a saved "
                'dataset directory, one {"prompt": ...} record each'
            )
    records, columns, counts = read_prompts(sources, input_format)
    conversational = is_conversational(records[0]["prompt"])
    chat = ChatTokenizer.load(tokenizer, chat_template)
    ids = _tokenize(chat, records)
    lengths = iter(len(tokens) for tokens in ids)  # in the order of the sources' records
    for count in counts:
        count["tokens"] = sum(next(lengths) for _ in range(count["documents"]))
    return write_prompts(
        prefix,
        ids,
        records,
        tokenizer=info,
        columns=columns,
        conversational=conversational,
        template=chat.template if conversational else None,
        input_format="prompt",
        sources=counts,
    )
