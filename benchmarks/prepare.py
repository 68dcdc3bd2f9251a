"""``baton data prepare`` throughput against the tokenizer's own ``encode_batch``.

The corpus is CPython's language reference, repeated to the sizes measured, written as
JSON Lines (one topic per line). Both sides run on the same cores:

* ``encode_batch``: the ``tokenizers`` library's batch call (its own thread pool over all
  cores) on the documents already in memory; nothing is read or written. Also
  ``encode_batch_fast`` (the same without character offsets), the call ``prepare``'s
  workers make: prepare against it is the cost of everything around the tokenizer.
* ``prepare``: the whole command (``prepare()`` with one worker process per core): read and
  parse the JSON Lines, tokenize, append end-of-document tokens, write ``.bin``/``.idx``
  through megatron-core's builder and the manifest, rename.

Tokens/s counts the tokenizer's tokens (not the appended end-of-document ids) on both
sides. Targets: prepare >= 0.8 of ``encode_batch`` at the larger size, and linear in the
input (tokens/s at twice the size within 10% of the smaller size's).

Run alone: ``uv run python benchmarks/run.py --only prepare``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row, interleave, median, paired_ratio

NAME = "prepare"
TARGET = 0.8
VOCAB = 4096


def _corpus(directory: Path, megabytes: float) -> tuple[Path, list[str]]:
    from baton.backends.corpus import reference_documents

    topics = reference_documents()
    documents: list[str] = []
    size = 0
    while size < megabytes * 1e6:
        text = topics[len(documents) % len(topics)]
        documents.append(text)
        size += len(text.encode("utf-8"))
    path = directory / f"corpus_{megabytes:g}mb.jsonl"
    with open(path, "w", encoding="utf-8") as stream:
        for text in documents:
            stream.write(json.dumps({"text": text}) + "\n")
    return path, documents


def run(quick: bool = False) -> list[Row]:
    from baton.backends.textdata import train_tokenizer
    from baton.tools.data.prepare import prepare

    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # encode_batch on every core
    cores = os.cpu_count() or 1
    sizes = (1.0, 2.0) if quick else (8.0, 16.0)
    rounds = 1 if quick else 3
    scratch = Path(tempfile.mkdtemp(prefix="baton-bench-prepare-"))
    try:
        tokenizer = train_tokenizer(scratch / "tok", vocab_size=VOCAB)
        corpora = {size: _corpus(scratch, size) for size in sizes}
        # imports megatron-core once, outside the timings
        prepare([corpora[sizes[0]][0]], tokenizer, scratch / "warm", workers=1)
        counted: dict[float, int] = {}

        def encode_case(size: float, method: str = "encode_batch"):
            def case() -> float:
                texts = corpora[size][1]
                started = time.perf_counter()
                encodings = getattr(tokenizer.tokenizer, method)(texts)
                seconds = time.perf_counter() - started
                counted[size] = sum(len(encoding) for encoding in encodings)
                return counted[size] / seconds

            return case

        def prepare_case(size: float):
            def case() -> float:
                out = scratch / f"out_{size:g}"
                started = time.perf_counter()
                manifest = prepare([corpora[size][0]], tokenizer, out, workers=cores, force=True)
                seconds = time.perf_counter() - started
                return (manifest.tokens - manifest.documents) / seconds

            return case

        cases = {}
        for size in sizes:
            cases[f"encode_batch {size:g}"] = encode_case(size)
            cases[f"encode_batch_fast {size:g}"] = encode_case(size, "encode_batch_fast")
            cases[f"prepare {size:g}"] = prepare_case(size)
        samples = interleave(cases, rounds=rounds, warmup=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    rows: list[Row] = []
    for size in sizes:
        encode, prep = samples[f"encode_batch {size:g}"], samples[f"prepare {size:g}"]
        ratio = paired_ratio(prep, encode)
        tokens = counted[size]
        rows.append(
            Row(
                NAME,
                f"encode_batch, {size:g} MB JSON Lines",
                median(encode) / 1e6,
                "M tokens/s",
                note=f"{tokens:,} tokens, {cores} cores (tokenizers' thread pool)",
            )
        )
        fast = samples[f"encode_batch_fast {size:g}"]
        rows.append(
            Row(
                NAME,
                f"encode_batch_fast, {size:g} MB JSON Lines",
                median(fast) / 1e6,
                "M tokens/s",
                ratio=paired_ratio(fast, encode),
                baseline="encode_batch",
                note="no offsets: the call prepare's workers make",
            )
        )
        big = size == sizes[-1]
        rows.append(
            Row(
                NAME,
                f"prepare, {size:g} MB JSON Lines",
                median(prep) / 1e6,
                "M tokens/s",
                ratio=ratio,
                baseline="encode_batch",
                target=">= 0.8" if big else "",
                passed=(ratio >= TARGET) if big else None,
                note=f"{cores} worker processes; read, tokenize, write .bin/.idx/.json; "
                f"{rounds} rounds",
            )
        )
        rows.append(
            Row(
                NAME,
                f"prepare vs encode_batch_fast, {size:g} MB",
                None,
                "",
                ratio=paired_ratio(prep, fast),
                baseline="encode_batch_fast",
                note="what reading, JSON, workers and writing cost over the bare call",
            )
        )
    small, large = sizes
    linear = paired_ratio(samples[f"prepare {large:g}"], samples[f"prepare {small:g}"])
    rows.append(
        Row(
            NAME,
            f"prepare tokens/s, {large:g} MB vs {small:g} MB",
            None,
            "",
            ratio=linear,
            baseline=f"{small:g} MB",
            target=">= 0.9",
            passed=linear >= 0.9,
            note="linear: twice the input takes twice the time",
        )
    )
    return rows
