"""What ``baton compare`` prints once the backends have run, from their logs: each run's
losses, the agreement table (first and final loss, the largest per-step relative
difference from the first backend's), the first-step table of a post-training
comparison, the per-step table of one that samples rollouts, and the loss charts.

Example::

    from pathlib import Path
    from baton.tools.compare_report import agreement_table, first_step_table, losses

    runs = {"fabric": losses(Path("runs/compare_backends/fabric")),
            "megatron": losses(Path("runs/compare_backends/megatron"))}
    print(agreement_table(runs, wall={"fabric": 41.0, "megatron": 63.0}))
    print(first_step_table(runs))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from baton.callbacks.sinks.jsonl import FILE_NAME, read_jsonl


def losses(run_dir: Path) -> list[float]:
    """The training losses a run logged, in step order."""
    return [r["loss"] for r in read_jsonl(run_dir / "logs" / FILE_NAME) if "loss" in r]


def max_relative_difference(values: Sequence[float], reference: Sequence[float]) -> float:
    """The largest ``|value - reference| / |reference|`` over the steps both logged."""
    pairs = list(zip(values, reference, strict=False))
    if not pairs:
        return math.nan
    return max(abs(v - r) / abs(r) for v, r in pairs)


def agreement_table(
    runs: dict[str, list[float]], wall: dict[str, float], expect: dict[str, str] | None = None
) -> str:
    """Each run's first and final loss and its largest per-step relative difference
    from the first run's losses; then, from ``expect``, what each backend's loss holds
    (a mixture-of-experts model: ``MOE_LOSSES``)."""
    reference_name, reference = next(iter(runs.items()))
    head = f"{'backend':<12}{'steps':>6}{'first loss':>12}{'final loss':>12}"
    lines = [head + f"{'max rel diff vs ' + reference_name:>26}{'wall s':>8}"]
    for backend, values in runs.items():
        first, last = (values[0], values[-1]) if values else (math.nan, math.nan)
        diff = max_relative_difference(values, reference)
        lines.append(
            f"{backend:<12}{len(values):>6}{first:>12.4f}{last:>12.4f}{diff:>26.2e}"
            f"{wall.get(backend, math.nan):>8.0f}"
        )
    if expect:
        lines.append("differences to expect (each backend's own loss):")
        lines += [f"  {backend}: {expect[backend]}" for backend in runs if backend in expect]
    return "\n".join(lines)


def per_step_table(runs: dict[str, list[float]]) -> str:
    """Each step's loss on every run, one row a step (blank where a run logged none)."""
    lines = ["step" + "".join(f"{backend:>16}" for backend in runs)]
    for step in range(max((len(values) for values in runs.values()), default=0)):
        cells = [f"{v[step]:>16.8f}" if step < len(v) else " " * 16 for v in runs.values()]
        lines.append(f"{step + 1:<4}" + "".join(cells))
    return "\n".join(lines)


def first_step_table(runs: dict[str, list[float]]) -> str:
    """Each run's first-step loss and its relative difference from the first run's."""
    reference_name, reference = next(iter(runs.items()))
    base = reference[0] if reference else math.nan
    lines = [f"{'backend':<12}{'first-step loss':>18}{'rel diff vs ' + reference_name:>24}"]
    for backend, values in runs.items():
        first = values[0] if values else math.nan
        lines.append(f"{backend:<12}{first:>18.8f}{abs(first - base) / abs(base):>24.2e}")
    return "\n".join(lines)


def report(
    backends: Sequence[str],
    root: Path,
    wall: dict[str, float],
    expect: dict[str, str] | None,
    *,
    first_step: bool = False,
    per_step: bool = False,
) -> None:
    """The agreement table and the loss charts of the backends that finished (and, with
    ``first_step``, their first-step losses to more digits; with ``per_step``, each
    step's loss on every backend)."""
    finished = [b for b in backends if (root / b / "logs" / FILE_NAME).is_file()]
    if finished:
        from baton.tools.plot import plot_runs

        charts = plot_runs([root / b for b in finished], root / "comparison")
        runs = {b: losses(root / b) for b in finished}
        print("\n" + agreement_table(runs, wall, expect))
        if first_step:
            print("\n" + first_step_table(runs))
        if per_step:
            print("\n" + per_step_table(runs))
        print("charts: " + ", ".join(str(path) for path in charts))
