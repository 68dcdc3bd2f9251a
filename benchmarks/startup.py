"""Start-up: how long a command takes to answer, through `uv run` as the README calls it.

Cases, interleaved:

- ``python -c pass`` in the project's environment: the interpreter alone;
- ``baton run recipes/quickstart.py --help`` called directly (the environment's script);
- the same through ``uv run --frozen``: what a user types. uv checks that the
  environment matches the lock and must not recompile bytecode on every call (a
  project-level ``compile-bytecode = true`` made it recompile ~28k files each time).

Target: ``uv run ... --help`` answers in under 1.5 s on a warm environment; its ratio
to the direct call shows what uv adds.

Run alone: ``uv run python benchmarks/run.py --only startup``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import Row, Skip, at_most, interleave, median, paired_ratio

NAME = "startup"
ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "recipes" / "quickstart.py")
#: seconds ``uv run baton run recipes/quickstart.py --help`` may take
TARGET_S = 1.5


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
    return rows
