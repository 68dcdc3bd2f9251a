"""Shared benchmark machinery: interleaved repetitions, paired ratios, one table.

A shared, noisy machine makes absolute times drift by tens of percent within a
minute. So every benchmark runs its cases interleaved (A, B, C, A, B, C, ...) and
reports the median of the *paired* ratios (B_i / A_i over rounds i): both sides of
a ratio were measured moments apart, and the median discards the rounds that a
neighbour's burst of work spoiled.

Example::

    from benchmarks.harness import Row, interleave, median, paired_ratio

    samples = interleave({"plain": run_plain, "baton": run_baton}, rounds=5)
    ratio = paired_ratio(samples["baton"], samples["plain"])
    rows = [Row("mine", "baton vs plain", median(samples["baton"]) * 1e3, "ms/step",
                ratio=ratio, baseline="plain", target="<= 1.02", passed=ratio <= 1.02)]
    print(format_table(rows))
"""

from __future__ import annotations

import gc
import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class Skip(Exception):
    """Raised by a benchmark (or one of its cases) that cannot run here; the message says why."""


@dataclass
class Row:
    """One line of the results table.

    ``value`` is the measured median in ``unit``; ``ratio`` compares it with the case
    named in ``baseline``; ``passed`` is ``None`` where there is no target or nothing
    was measured (a skipped case carries its reason in ``note``).
    """

    benchmark: str
    case: str
    value: float | None
    unit: str
    ratio: float | None = None
    baseline: str = ""
    target: str = ""
    passed: bool | None = None
    note: str = ""


def skipped(benchmark: str, case: str, reason: str) -> Row:
    """A row for a case that could not run, with the reason."""
    return Row(benchmark, case, None, "", note=f"skipped: {reason}")


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values: the benchmark recorded no samples")
    return statistics.median(values)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median over rounds of ``numerators[i] / denominators[i]`` (both sides measured together)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"unpaired samples: {len(numerators)} vs {len(denominators)}")
    return median([n / d for n, d in zip(numerators, denominators, strict=True)])


def interleave(
    cases: Mapping[str, Callable[[], float]], *, rounds: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Run every case once per round, in order, ``warmup + rounds`` times.

    Each case returns one measurement (say, seconds per step of one run); the first
    ``warmup`` rounds are discarded (imports, allocator, caches). Garbage is collected
    before each measurement so one case's garbage is not paid by the next.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for round_index in range(warmup + rounds):
        for name, case in cases.items():
            gc.collect()
            value = case()
            if round_index >= warmup:
                samples[name].append(value)
    return samples


class Lockstep:
    """Run several training loops side by side, one block of steps at a time, each loop
    in a process of its own.

    Finer interleaving than ``interleave``: each loop calls ``mark()`` at the end of
    every block (say every 10 steps); the loops take turns, one block each, while the
    others wait. Each block's time is measured inside its process, from resuming to the
    next ``mark``, so the loops never overlap and block i of every loop was measured
    within a second of the others'. The order rotates every round (A B C, B C A, C A B,
    ...) so that no loop always runs right after the same neighbour.

    A loop is ``(function, args)``, called as ``function(*args, mark)`` in a spawned
    process (so ``function`` lives at a module's top level); what it returns comes back
    from ``run``. Separate processes, as users run them: loops sharing one interpreter
    share its environment (a patch one loop's framework sets for its run reaches the
    others), its garbage collector and its allocator.

    Example::

        def loop(steps, mark):            # a loop calls mark() after each block
            for step in range(1, steps + 1):
                train_one_step()
                if step % 10 == 0:
                    mark()
            return "done"

        blocks, results = Lockstep({"a": (loop, (100,)), "b": (other_loop, (100,))}).run()
        ratio = paired_ratio(blocks["b"][1:], blocks["a"][1:])  # drop the warm-up block
    """

    def __init__(self, loops: Mapping[str, tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        self.loops = dict(loops)

    def run(self) -> tuple[dict[str, list[float]], dict[str, Any]]:
        """``(name -> block seconds, name -> what the loop returned)``."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        pipes: dict[str, Any] = {}
        processes = []
        for name, (function, args) in self.loops.items():
            pipes[name], theirs = context.Pipe()
            process = context.Process(
                target=_lockstep_loop, args=(theirs, function, args), name=name, daemon=True
            )
            process.start()
            processes.append(process)
        blocks: dict[str, list[float]] = {name: [] for name in self.loops}
        results: dict[str, Any] = {}
        names = list(self.loops)
        turn = 0
        try:
            while len(results) < len(names):
                # rotate who goes first each round, so no loop always follows the same one
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    if name in results:
                        continue
                    pipes[name].send("go")
                    try:
                        kind, value = pipes[name].recv()
                    except EOFError:
                        raise RuntimeError(f"loop {name!r} failed: its process died") from None
                    if kind == "error":
                        raise RuntimeError(f"loop {name!r} failed: {value}")
                    if kind == "block":
                        blocks[name].append(value)
                    else:
                        results[name] = value
        finally:
            for process in processes:
                if process.is_alive() and process.name not in results:
                    process.kill()
                process.join()
        return blocks, results


def _lockstep_loop(pipe: Any, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """One ``Lockstep`` loop, in its own process: wait for each turn, time each block."""
    pipe.recv()
    start = time.perf_counter()

    def mark() -> None:
        nonlocal start
        pipe.send(("block", time.perf_counter() - start))
        pipe.recv()
        start = time.perf_counter()

    try:
        result = function(*args, mark)
    except BaseException as error:  # reported to the parent, which names the loop
        pipe.send(("error", repr(error)))
        return
    pipe.send(("done", result))


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self.seconds = 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


def at_most(value: float | None, limit: float) -> bool | None:
    """``value <= limit``, or ``None`` when nothing was measured."""
    return None if value is None else value <= limit


# -- output -------------------------------------------------------------------------------
def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text (and Markdown) table: benchmark, case, value, ratio, target, result."""
    header = ["benchmark", "case", "value", "ratio", "target", "ok", "note"]
    body = []
    for r in rows:
        ok = {True: "yes", False: "NO", None: ""}[r.passed]
        ratio = f"{r.ratio:.3f} vs {r.baseline}" if r.ratio is not None else ""
        value = f"{_fmt(r.value)} {r.unit}".strip() if r.value is not None else "-"
        body.append([r.benchmark, r.case, value, ratio, r.target, ok, r.note])
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(b) for b in body)])


def machine() -> dict[str, Any]:
    """Where the numbers were taken: CPU count, threads, accelerator, library versions."""
    import os

    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "device": "cpu",
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_json(path: Path, rows: Sequence[Row], *, settings: dict[str, Any]) -> None:
    """Write the rows with the machine description and run settings to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "settings": settings, "rows": [asdict(r) for r in rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
