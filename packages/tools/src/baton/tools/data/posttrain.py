"""``baton data prepare --seq-len N``: conversations or preference pairs, tokenized and packed.

Example::

    from baton.tools.data.posttrain import prepare_posttrain

    manifest = prepare_posttrain(["chat.jsonl"], "runs/tok", "data/chat", seq_len=2048)
    manifest["objective"], manifest["packing"]["fill"]     # "sft", 0.97

Every record is read and checked first (a bad record is refused before ``transformers``
is imported), then rendered (:class:`~baton.tools.data.chat.ChatTokenizer`, conversations
:data:`CHUNK` at a time) and packed by best-fit decreasing into rows of at most
``seq_len + 1`` tokens (a preference pair, chosen then rejected, is one item, so it stays
in one row) before anything is written; bad input raises :class:`DataError` and writes
nothing. Then :func:`~baton.data.packed.write_packed` writes ``PREFIX.bin/.idx/.mask.bin/.json``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.data import DataError, load_tokenizer, manifest_path, split_prefix
from baton.data.packed import mask_path, write_packed
from baton.tools.data.chat import MASKS, ChatTokenizer
from baton.tools.data.formats import FORMATS, check_record, record_format
from baton.tools.data.packing import best_fit_decreasing
from baton.tools.data.sources import Source, open_sources

Document = tuple[list[int], list[int]]


@dataclass
class _Item:
    """What packing places: one conversation, or one pair (chosen, rejected)."""

    documents: list[Document]
    where: str

    @property
    def length(self) -> int:
        return sum(len(tokens) for tokens, _ in self.documents)


@dataclass
class _SourceCounts:
    source: Source
    documents: int = 0
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.source.path),
            "bytes": self.source.size,
            "documents": self.documents,
            "tokens": self.tokens,
        }


@dataclass
class _Read:
    items: list[_Item] = field(default_factory=list)
    counts: list[_SourceCounts] = field(default_factory=list)
    input_format: str | None = None
    first_where: str = ""
    #: rendered by the chat template (turns, not plain strings)
    conversational: bool = False


def _records(sources: list[Source]) -> Iterator[tuple[_SourceCounts, str, dict[str, Any]]]:
    for source in sources:
        counts = _SourceCounts(source)
        for where, record in source.records():
            yield counts, where, record


def _mask_rule(input_format: str, mask: str) -> str:
    if input_format == "messages":
        return mask
    if mask == "all":
        if input_format == "preference":
            raise DataError(
                "--mask all does not apply to preference pairs: DPO scores each pair's "
                "completions; leave --mask out"
            )
        return "all"
    return "completion"


def _tokenize(chat: ChatTokenizer, record: dict[str, Any], fmt: str, rule: str) -> list[Document]:
    if fmt == "messages":
        return [chat.messages(record["messages"], rule)]
    if fmt == "prompt_completion":
        tokens, mask = chat.prompt_completion(record["prompt"], record["completion"])
        return [(tokens, [1] * len(tokens) if rule == "all" else mask)]
    chosen, rejected = chat.pair(record["prompt"], record["chosen"], record["rejected"])
    return [chosen, rejected]


def _check_all(sources: list[Source], forced: str | None) -> tuple[_Read, list[tuple]]:
    """Every record read and checked (before the chat tokenizer is even imported), with
    the source counts it adds to."""
    read = _Read(input_format=forced)
    records = []
    for counts, where, record in _records(sources):
        if not read.counts or read.counts[-1] is not counts:
            read.counts.append(counts)
        fmt = forced or record_format(record, where)
        if read.input_format is None:
            read.input_format, read.first_where = fmt, where
        elif fmt != read.input_format:
            raise DataError(
                f"{where} is {fmt} but {read.first_where} is {read.input_format}: two formats "
                "in one dataset; prepare each format on its own, or pass --format"
            )
        check_record(record, fmt, where)
        read.conversational |= fmt == "messages" or isinstance(record["prompt"], list)
        records.append((counts, where, record))
    if not records:
        names = ", ".join(str(source.path) for source in sources)
        raise DataError(f"no records in {names}; check the files")
    return read, records


#: conversations rendered and tokenized together (one ``encode_batch`` of their texts)
CHUNK = 512


def _documents(
    chat: ChatTokenizer, chunk: list[tuple], fmt: str, rule: str
) -> Iterator[list[Document]]:
    """The documents of each record of ``chunk``, in order. Conversations go through the
    chat tokenizer together; a chunk that fails is done again record by record, so the
    error names the first record that fails, as it would one record at a time."""
    if fmt == "messages":
        try:
            together = chat.conversations([record["messages"] for _, _, record in chunk], rule)
        except DataError:
            pass
        else:
            yield from ([document] for document in together)
            return
    for _, where, record in chunk:
        try:
            yield _tokenize(chat, record, fmt, rule)
        except DataError as error:
            raise DataError(f"{where}: {error}") from None


def _tokenize_all(read: _Read, records: list[tuple], chat: ChatTokenizer, rule: str) -> None:
    fmt = str(read.input_format)
    for start in range(0, len(records), CHUNK):
        chunk = records[start : start + CHUNK]
        for (counts, where, _), documents in zip(
            chunk, _documents(chat, chunk, fmt, rule), strict=True
        ):
            if not any(any(flags[1:]) for _, flags in documents):
                raise DataError(
                    f"{where}: no token of this record is a target after rendering; check "
                    "the record and the chat template, or pass --mask all"
                )
            read.items.append(_Item(documents, where))
            counts.documents += len(documents)
            counts.tokens += sum(len(tokens) for tokens, _ in documents)


def _truncate(item: _Item, capacity: int) -> bool:
    """Cut ``item`` to ``capacity`` tokens (each side of a pair to its share); True if it
    still has a target."""
    if len(item.documents) == 1:
        tokens, mask = item.documents[0]
        item.documents = [(tokens[:capacity], mask[:capacity])]
    else:
        (chosen, chosen_mask), (rejected, rejected_mask) = item.documents
        keep_chosen = min(len(chosen), max(capacity // 2, capacity - len(rejected)))
        keep_rejected = min(len(rejected), capacity - keep_chosen)
        item.documents = [
            (chosen[:keep_chosen], chosen_mask[:keep_chosen]),
            (rejected[:keep_rejected], rejected_mask[:keep_rejected]),
        ]
    return all(any(flags[1:]) for _, flags in item.documents)


def _fit(items: list[_Item], capacity: int, seq_len: int, truncate: bool) -> dict[str, int]:
    """Refuse (or with ``truncate`` cut) items longer than a row; counts for the manifest."""
    long = [item for item in items if item.length > capacity]
    if long and not truncate:
        longest = max(long, key=lambda item: item.length)
        what = "pairs" if len(longest.documents) == 2 else "documents"
        raise DataError(
            f"{len(long)} {what} are longer than a row of seq_len + 1 = {capacity} tokens "
            f"(the longest: {longest.length} tokens, {longest.where}); raise --seq-len above "
            f"{longest.length - 1}, or pass --truncate to cut them"
        )
    dropped = [item for item in long if not _truncate(item, capacity)]
    for item in dropped:
        items.remove(item)
    if not items:
        raise DataError(
            f"every record lost its targets when cut to {capacity} tokens; raise --seq-len "
            f"(now {seq_len})"
        )
    return {"truncated": len(long), "dropped_without_targets": len(dropped)}


def _check_options(seq_len: int, input_format: str | None, mask: str) -> None:
    if seq_len < 1:
        raise DataError(f"--seq-len must be at least 1, not {seq_len}")
    if input_format is not None and input_format not in FORMATS:
        raise DataError(f"--format {input_format!r} is not one of {', '.join(FORMATS)}")
    if mask not in MASKS:
        raise DataError(f"--mask {mask!r} is not one of {', '.join(MASKS)}")


def _open_records(inputs: Sequence[str | Path]) -> list[Source]:
    sources = open_sources(inputs)
    for source in sources:
        if source.kind == "txt":
            raise DataError(
                f"{source.path} is plain text; conversations and preference pairs come as "
                ".jsonl, .parquet or a saved dataset directory (plain text is prepared "
                "without --seq-len)"
            )
    return sources


def prepare_posttrain(
    inputs: Sequence[str | Path],
    tokenizer: str | Path,
    output: str | Path,
    *,
    seq_len: int,
    input_format: str | None = None,
    chat_template: str | Path | None = None,
    mask: str = "assistant",
    truncate: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """Tokenize and pack ``inputs`` into ``output`` (a prefix); return the manifest.

    ``input_format`` (``messages``, ``prompt_completion``, ``preference``) is recognised
    from the fields when None. ``mask`` is ``assistant``, ``all`` or ``last_assistant``
    (prompt/completion records and pairs mask the completion). Raises :class:`DataError`,
    with nothing written, for any bad input.
    """
    from baton.tools.data.prepare import check_output

    _check_options(seq_len, input_format, mask)
    name = split_prefix(output)
    files = [Path(name + ".bin"), Path(name + ".idx"), mask_path(name), manifest_path(name)]
    prefix = check_output(output, force, files)
    info = load_tokenizer(tokenizer)
    sources = _open_records(inputs)
    read, records = _check_all(sources, input_format)
    fmt = str(read.input_format)
    if fmt == "prompt":
        raise DataError(
            f"{read.first_where} is a prompt alone: prompts (for GRPO) are not packed into "
            "rows; leave out --seq-len"
        )
    rule = _mask_rule(fmt, mask)
    chat = ChatTokenizer.load(tokenizer, chat_template)
    _tokenize_all(read, records, chat, rule)
    capacity = seq_len + 1
    counts = _fit(read.items, capacity, seq_len, truncate)
    rows_of_items = best_fit_decreasing([item.length for item in read.items], capacity)
    rows = [[doc for index in row for doc in read.items[index].documents] for row in rows_of_items]
    return write_packed(
        prefix,
        rows,
        objective="preference" if fmt == "preference" else "sft",
        seq_len=seq_len,
        tokenizer=info,
        input_format=fmt,
        template=chat.template if read.conversational else None,
        mask=rule,
        packing={"method": "best_fit_decreasing"},
        sources=[count.to_json() for count in read.counts],
        records=len(read.items),
        **counts,
    )
