"""Run baton's benchmarks and print one table of ratios.

Usage::

    uv run python benchmarks/run.py                 # all of them (< 10 min on 2 cores)
    uv run python benchmarks/run.py --only dispatch # one (repeat --only for several)
    uv run python benchmarks/run.py --quick         # tiny settings: a smoke run

Results also go to ``benchmarks/results/latest.json`` (``--quick``:
``benchmarks/results/quick.json``; ``--json PATH`` to choose). Every benchmark runs
its cases interleaved and reports medians of paired ratios (see ``harness.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

# One thread: steadier on a shared machine (set before torch is imported).
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
# Import benchmarks as a package from the repository root, never this folder's modules
# as top-level names (which could shadow installed packages).
HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(HERE)]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Row, Skip, format_table, skipped, write_json  # noqa: E402

#: name -> module under benchmarks/ with ``run(quick: bool) -> list[Row]``, in run order.
BENCHMARKS: dict[str, str] = {
    "dispatch": "benchmarks.dispatch",
    "host_syncs": "benchmarks.host_syncs",
    "lightning": "benchmarks.vs_lightning",
    "checkpoint": "benchmarks.checkpoint",
    "native": "benchmarks.native",
    "prepare": "benchmarks.prepare",
    "startup": "benchmarks.startup",
    "posttrain": "benchmarks.posttrain",
    "grpo": "benchmarks.grpo",
}


def run_one(name: str, quick: bool) -> list[Row]:
    """Import and run one benchmark; a failure becomes a row, the others still run."""
    from importlib import import_module

    try:
        return import_module(BENCHMARKS[name]).run(quick=quick)
    except Skip as reason:
        return [skipped(name, "-", str(reason))]
    except Exception as error:
        traceback.print_exc()
        return [Row(name, "-", None, "", passed=False, note=f"error: {type(error).__name__}")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument("--quick", action="store_true", help="tiny settings (smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    args = parser.parse_args(argv)

    names = args.only or list(BENCHMARKS)
    rows: list[Row] = []
    started = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += run_one(name, args.quick)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - started

    print(format_table(rows))
    print(f"\n{len(rows)} rows in {total:.0f} s{' (quick)' if args.quick else ''}")
    default = "quick.json" if args.quick else "latest.json"
    out = args.json or ROOT / "benchmarks" / "results" / default
    write_json(out, rows, settings={"only": names, "quick": args.quick, "seconds": total})
    print(f"results written to {out}")
    errors = [r for r in rows if r.note.startswith("error")]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
