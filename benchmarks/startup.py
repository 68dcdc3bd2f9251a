"""Start-up: how long a command takes to answer, through `uv run` as the README calls it.

Cases, interleaved:

- ``python -c pass`` in the project's environment: the interpreter alone;
- ``baton run recipes/quickstart.py --help`` called directly (the environment's script);
- the same through ``uv run --frozen``: what a user types. uv checks that the
  environment matches the lock and must not recompile bytecode on every call (a
  project-level ``compile-bytecode = true`` made it recompile ~28k files each time).

Target: ``uv run ... --help`` answers in under 1.5 s on a warm environment; its ratio
to the direct call shows what uv adds.

And ``baton data prepare`` of a small file (0.5 MB of JSON Lines, one worker) against the
tokenizer alone in a fresh interpreter (``tokenizers`` loads ``tokenizer.json``, reads
the same lines and calls ``encode_batch_fast``): what the command adds around the
tokenizer, start-up included (no framework is imported before the first document).
Target: at most 3x the tokenizer alone.

Run alone: ``uv run python benchmarks/run.py --only startup``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Row, Skip, at_most, interleave, median, paired_ratio

NAME = "startup"
ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "recipes" / "quickstart.py")
#: seconds ``uv run baton run recipes/quickstart.py --help`` may take
TARGET_S = 1.5
#: ``baton data prepare`` of a small file against the tokenizer alone, at most
PREPARE_TARGET = 3.0
#: the tokenizer alone: load it, read the JSON Lines, tokenize every text
TOKENIZE_ALONE = (
    "import json, sys\n"
    "from tokenizers import Tokenizer\n"
    "tokenizer = Tokenizer.from_file(sys.argv[1])\n"
    "with open(sys.argv[2], encoding='utf-8') as lines:\n"
    "    texts = [json.loads(line)['text'] for line in lines]\n"
    "tokenizer.encode_batch_fast(texts)\n"
)


def _timed(command: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "UV_COMPILE_BYTECODE"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-500:]}")
    if "Bytecode compiled" in done.stderr:
        raise RuntimeError("uv recompiled bytecode on `uv run`: remove compile-bytecode")
    return seconds


def run(quick: bool = False) -> list[Row]:
    uv = shutil.which("uv")
    if uv is None:
        raise Skip("uv is not on PATH")
    baton = Path(sys.executable).with_name("baton")
    if not baton.exists():
        raise Skip(f"no baton script beside {sys.executable}")
    cases = {
        "python -c pass": lambda: _timed([sys.executable, "-c", "pass"]),
        "baton run quickstart --help": lambda: _timed([str(baton), "run", QUICKSTART, "--help"]),
        "uv run baton run quickstart --help": lambda: _timed(
            [uv, "run", "--frozen", "baton", "run", QUICKSTART, "--help"]
        ),
    }
    scratch = Path(tempfile.mkdtemp(prefix="baton-bench-startup-"))
    try:
        prepare_rows = _prepare_start(baton, scratch, rounds=2 if quick else 5)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    samples = interleave(cases, rounds=2 if quick else 7)
    direct = samples["baton run quickstart --help"]
    rows = [Row(NAME, "python -c pass", median(samples["python -c pass"]), "s")]
    rows.append(Row(NAME, "baton run quickstart --help", median(direct), "s"))
    through_uv = samples["uv run baton run quickstart --help"]
    seconds = median(through_uv)
    rows.append(
        Row(
            NAME,
            "uv run baton run quickstart --help",
            seconds,
            "s",
            ratio=paired_ratio(through_uv, direct),
            baseline="baton run quickstart --help",
            target=f"< {TARGET_S:g} s",
            passed=at_most(seconds, TARGET_S),
            note="warm environment; no bytecode recompiled",
        )
    )
    return rows + prepare_rows


def _prepare_start(baton: Path, scratch: Path, *, rounds: int) -> list[Row]:
    """``baton data prepare`` of a 0.5 MB file against the tokenizer alone."""
    from baton.data import train_tokenizer
    from benchmarks.prepare import _corpus

    tokenizer = train_tokenizer(scratch / "tok", vocab_size=4096)
    corpus, _ = _corpus(scratch, 0.5)
    prepare = [str(baton), "data", "prepare", str(corpus), "--tokenizer", str(tokenizer.path)]
    prepare += ["--output", str(scratch / "out" / "corpus"), "--workers", "1", "--force"]
    alone = [sys.executable, "-c", TOKENIZE_ALONE, str(tokenizer.path / "tokenizer.json")]
    cases = {
        "tokenizer alone": lambda: _timed([*alone, str(corpus)]),
        "baton data prepare": lambda: _timed(prepare),
    }
    samples = interleave(cases, rounds=rounds)
    seconds = median(samples["baton data prepare"])
    ratio = paired_ratio(samples["baton data prepare"], samples["tokenizer alone"])
    return [
        Row(NAME, "tokenizer alone, 0.5 MB JSON Lines", median(samples["tokenizer alone"]), "s"),
        Row(
            NAME,
            "baton data prepare, 0.5 MB JSON Lines",
            seconds,
            "s",
            ratio=ratio,
            baseline="tokenizer alone, 0.5 MB JSON Lines",
            target=f"<= {PREPARE_TARGET:g}x",
            passed=at_most(ratio, PREPARE_TARGET),
            note="one worker; start-up, reading, tokenizing and writing .bin/.idx/.json",
        ),
    ]
