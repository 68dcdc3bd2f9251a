"""``baton data prepare``: tokenize local text into Megatron's indexed dataset, once.

Example::

    from baton.tools.data.prepare import prepare

    manifest = prepare(["web.jsonl", "notes.txt"], "runs/tok", "data/corpus", workers=2)
    manifest.documents, manifest.tokens      # also in data/corpus.json

Documents are read in order in this process, tokenized in batches by ``workers`` worker
processes (each with its own copy of the tokenizer, ``encode_batch_fast``; the tokenizer's
own special tokens are added as it is configured to add them), the end-of-document token
is appended to each, and :class:`~baton.data.indexed_writer.IndexedWriter` writes
``PREFIX.bin`` and ``PREFIX.idx`` (the bytes of megatron-core's ``IndexedDatasetBuilder``,
one sequence per document, exactly as Megatron's ``preprocess_data.py``) in input order,
so the same input gives the same bytes whatever the number of workers. ``PREFIX.json`` is the manifest (tokenizer fingerprint, counts, sources).

Worker processes are started with ``spawn``: a script that calls :func:`prepare` with
``workers > 1`` must do so under ``if __name__ == "__main__":`` (recipes run by ``baton run``
and the ``baton data`` command already are).

Everything is written under temporary names and renamed at the end (``.bin``, then
``.json``, then ``.idx``): an interrupted or failed run leaves no ``PREFIX.idx``, so nothing
that looks complete. Existing outputs are replaced only with ``force=True``.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from baton.data import (
    DataError,
    Manifest,
    SourceFile,
    TokenizerInfo,
    load_tokenizer,
    manifest_path,
    split_prefix,
)
from baton.data.indexed_writer import IndexedWriter
from baton.tools.data.sources import Source, open_sources

#: token dtypes ``--dtype`` accepts (megatron-core's DType names)
DTYPES = ("auto", "uint16", "int32")
#: a batch sent to a worker closes at this many characters or documents
BATCH_CHARS = 1 << 18
BATCH_DOCUMENTS = 2048


def choose_dtype(tokenizer: TokenizerInfo, dtype: str = "auto") -> np.dtype:
    """The token dtype: megatron-core's choice for ``auto``; an error if ids do not fit."""
    if dtype not in DTYPES:
        raise DataError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype == "auto":
        # megatron.core.datasets.indexed_dataset.DType.optimal_dtype, without importing torch
        return np.dtype(np.uint16 if tokenizer.vocab_size < 65500 else np.int32)
    chosen = np.dtype(dtype)
    largest = int(np.iinfo(chosen).max)
    if tokenizer.vocab_size - 1 > largest:
        raise DataError(
            f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but {dtype} holds "
            f"ids up to {largest}; use --dtype int32 (or auto)"
        )
    return chosen


# ---- worker side: one tokenizer per process -------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_json: str, eod_id: int, dtype: str, parallel: bool) -> None:
    if not parallel:  # one thread per worker process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _WORKER.update(
        tokenizer=Tokenizer.from_str(tokenizer_json), eod_id=eod_id, dtype=np.dtype(dtype)
    )


def _encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, lengths)`` of a batch: each document's ids then the end-of-document id."""
    tokenizer, eod = _WORKER["tokenizer"], _WORKER["eod_id"]
    flat: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for position, encoding in enumerate(tokenizer.encode_batch_fast(texts)):
        ids = encoding.ids
        flat += ids
        flat.append(eod)
        lengths[position] = len(ids) + 1
    return np.array(flat, dtype=_WORKER["dtype"]), lengths


@dataclass(frozen=True)
class _Done:
    """A result already computed, with the interface of a ``Future``."""

    value: Any

    def result(self) -> Any:
        return self.value


class _Inline:
    """The process pool's interface, run in this process (``workers=1``)."""

    def submit(self, func: Callable, *args: Any) -> _Done:
        return _Done(func(*args))

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


# ---- reading, writing -----------------------------------------------------------------


@dataclass
class _Counts:
    documents: int = 0
    tokens: int = 0


def _batches(source: Source, skipped: list[int]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for text in source.documents():
        if not text.strip():
            skipped[0] += 1
            continue
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCUMENTS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _outputs(prefix: str) -> dict[str, Path]:
    return {
        "bin": Path(prefix + ".bin"),
        "json": manifest_path(prefix),
        "idx": Path(prefix + ".idx"),
    }


def _progress(enabled: bool, total: int):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]prepare[/]"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[documents]:,} documents, {task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def check_output(output: str | Path, force: bool, files: Sequence[Path]) -> str:
    """The prefix of ``output``; :class:`DataError` for a directory, or for existing
    ``files`` without ``force``."""
    prefix = split_prefix(output)
    if Path(prefix).is_dir() or str(output).endswith(("/", os.sep)):
        raise DataError(
            f"--output {output} is a directory; give a prefix inside it, e.g. "
            f"{Path(prefix) / 'corpus'} (writes corpus.bin, corpus.idx, corpus.json)"
        )
    existing = [str(path) for path in files if path.exists()]
    if existing and not force:
        raise DataError(
            f"{', '.join(existing)} already exist; pass --force to replace them, or choose "
            "another --output"
        )
    return prefix


def prepare(
    inputs: Sequence[str | Path],
    tokenizer: str | Path | TokenizerInfo,
    output: str | Path,
    *,
    text_key: str = "text",
    workers: int | None = None,
    txt_split: str = "file",
    dtype: str = "auto",
    force: bool = False,
    progress: bool = False,
) -> Manifest:
    """Tokenize ``inputs`` into ``output`` (a prefix) and return the manifest written.

    Raises :class:`DataError` (nothing written) for a missing input, an unknown input
    type, an existing output without ``force``, a tokenizer that cannot be loaded or
    whose ids do not fit ``dtype``; and (temporaries and the folders it made removed, no
    output) for a missing
    ``text_key``, text that is not UTF-8, or a corpus without any text.
    """
    info = tokenizer if isinstance(tokenizer, TokenizerInfo) else load_tokenizer(tokenizer)
    token_dtype = choose_dtype(info, dtype)
    sources = open_sources(inputs, text_key=text_key, txt_split=txt_split)
    prefix = check_output(output, force, list(_outputs(split_prefix(output)).values()))
    finals = _outputs(prefix)
    folder = Path(prefix).parent
    new_folders = [d for d in (folder, *folder.parents) if not d.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
    temporaries = {kind: Path(f"{path}.partial-{os.getpid()}") for kind, path in finals.items()}
    written = False
    try:
        manifest = _write(info, token_dtype, sources, temporaries, workers, progress, text_key)
        for kind in ("idx", "json"):  # replace: old index first, so no old idx pairs a new bin
            finals[kind].unlink(missing_ok=True)
        for kind in ("bin", "json", "idx"):
            os.replace(temporaries[kind], finals[kind])
        written = True
        return manifest
    finally:
        for path in temporaries.values():
            path.unlink(missing_ok=True)
        for new_folder in [] if written else new_folders:  # a refusal leaves no empty folder
            with contextlib.suppress(OSError):
                new_folder.rmdir()


def _start_pool(workers: int, init_args: tuple) -> Any:
    """``workers`` tokenizer processes, or this process itself for one worker."""
    if workers == 1:
        _init_worker(*init_args)
        return _Inline()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: safe with torch's threads in this process; a worker that dies breaks the
    # pool (BrokenProcessPool) instead of being replaced forever
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=init_args,
    )


@dataclass
class _Tally:
    """Counts while writing: per source and in total."""

    total: _Counts = field(default_factory=_Counts)
    sources: list[SourceFile] = field(default_factory=list)
    skipped: list[int] = field(default_factory=lambda: [0])


def _tokenize_into(
    builder: Any, pool: Any, sources: list[Source], workers: int, progress: bool
) -> _Tally:
    """Read every source in order, tokenize its batches in the pool, write them in order."""
    tally = _Tally()
    total_bytes = sum(source.size for source in sources)
    bar = _progress(progress, total_bytes)
    task = bar.add_task("prepare", total=total_bytes, documents=0, tokens=0)
    done_bytes = 0

    def write(result: tuple[np.ndarray, np.ndarray], counts: _Counts) -> None:
        tokens, lengths = result
        start = 0
        for length in lengths.tolist():  # one sequence per document, as preprocess_data.py
            builder.add_document(tokens[start : start + length], [length])
            start += length
        for tally_counts in (counts, tally.total):
            tally_counts.documents += len(lengths)
            tally_counts.tokens += len(tokens)

    with bar:
        for source in sources:
            counts = _Counts()
            pending: deque = deque()  # batches in flight, written in the order they were read
            read_chars = 0
            for batch in _batches(source, tally.skipped):
                pending.append(pool.submit(_encode, batch))
                read_chars += sum(len(text) for text in batch)
                while len(pending) > 2 * workers:
                    write(pending.popleft().result(), counts)
                bar.update(
                    task,
                    completed=done_bytes + min(read_chars, source.size),
                    documents=tally.total.documents,
                    tokens=tally.total.tokens,
                )
            while pending:
                write(pending.popleft().result(), counts)
            done_bytes += source.size
            bar.update(
                task,
                completed=done_bytes,
                documents=tally.total.documents,
                tokens=tally.total.tokens,
            )
            tally.sources.append(
                SourceFile(str(source.path), source.size, counts.documents, counts.tokens)
            )
    return tally


def _write(
    info: TokenizerInfo,
    token_dtype: np.dtype,
    sources: list[Source],
    temporaries: dict[str, Path],
    workers: int,
    progress: bool,
    text_key: str,
) -> Manifest:
    """Write the three temporaries; raise (leaving them to be removed) on bad input."""
    tokenizer_json = (info.path / "tokenizer.json").read_text(encoding="utf-8")
    pool = _start_pool(workers, (tokenizer_json, info.eod_id, token_dtype.name, workers == 1))
    try:
        builder = IndexedWriter(temporaries["bin"], token_dtype)
        try:
            tally = _tokenize_into(builder, pool, sources, workers, progress)
        finally:
            builder.close()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    uses_key = any(source.kind != "txt" for source in sources)
    if tally.total.documents == 0:
        names = ", ".join(str(source.path) for source in sources)
        key = f" and --text-key (now {text_key!r})" if uses_key else ""
        raise DataError(
            f"no text in {names} ({tally.skipped[0]} empty documents); check the files{key}"
        )
    builder.finalize(str(temporaries["idx"]))
    manifest = Manifest(
        tokenizer_fingerprint=info.fingerprint,
        tokenizer_path=str(info.path),
        vocab_size=info.vocab_size,
        eod_token=info.eod_token,
        eod_id=info.eod_id,
        dtype=token_dtype.name,
        documents=tally.total.documents,
        tokens=tally.total.tokens,
        sources=tuple(tally.sources),
        skipped_empty=tally.skipped[0],
        text_key=text_key if uses_key else None,
    )
    temporaries["json"].write_text(manifest.dumps(), encoding="utf-8")
    for path in temporaries.values():  # on disk before the renames make them visible
        with open(path, "rb+") as stream:
            os.fsync(stream.fileno())
    return manifest
