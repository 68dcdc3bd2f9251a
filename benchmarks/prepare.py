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
sides. Wall-clock tokens/s needs the cores to itself; on a shared machine the rows
"tokens per CPU-second" (CPU time of every process involved: this one, its threads and
prepare's worker processes) compare the work done per token regardless of other load. Targets: prepare >= 0.8 of ``encode_batch`` at the larger size, and linear in the
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
    from baton.data.corpus import reference_documents

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


def _cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its finished, reaped child processes."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run(quick: bool = False) -> list[Row]:
    from baton.data import train_tokenizer
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
        #: case -> tokens per CPU-second of every round (the first is the warm-up round)
        per_cpu_second: dict[str, list[float]] = {}

        def encode_case(size: float, method: str = "encode_batch"):
            def case() -> float:
                texts = corpora[size][1]
                cpu, started = _cpu_seconds(), time.perf_counter()
                encodings = getattr(tokenizer.tokenizer, method)(texts)
                seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
                counted[size] = sum(len(encoding) for encoding in encodings)
                per_cpu_second.setdefault(f"{method} {size:g}", []).append(counted[size] / cpu)
                return counted[size] / seconds

            return case

        def prepare_case(size: float):
            def case() -> float:
                out = scratch / f"out_{size:g}"
                cpu, started = _cpu_seconds(), time.perf_counter()
                manifest = prepare([corpora[size][0]], tokenizer, out, workers=cores, force=True)
                seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
                tokens = manifest.tokens - manifest.documents
                per_cpu_second.setdefault(f"prepare {size:g}", []).append(tokens / cpu)
                return tokens / seconds

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
    cpu = {name: values[1:] for name, values in per_cpu_second.items()}  # drop the warm-up
    for size in sizes:
        big = size == sizes[-1]
        ratio = paired_ratio(cpu[f"prepare {size:g}"], cpu[f"encode_batch {size:g}"])
        rows.append(
            Row(
                NAME,
                f"prepare tokens per CPU-second, {size:g} MB",
                None,
                "",
                ratio=ratio,
                baseline="encode_batch",
                target=">= 0.8" if big else "",
                passed=(ratio >= TARGET) if big else None,
                note=f"prepare {median(cpu[f'prepare {size:g}']) / 1e6:.3f}, encode_batch "
                f"{median(cpu[f'encode_batch {size:g}']) / 1e6:.3f} M tokens/CPU-s (all "
                "processes): robust to other load on the machine",
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
