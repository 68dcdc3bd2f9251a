"""``baton plot RUN_DIR...``: PNG charts of loss, learning rate and throughput.

Example::

    baton plot runs/quickstart            # -> runs/quickstart/plots/*.png
    baton plot runs/quickstart --out /tmp/charts
    baton plot runs/fabric runs/megatron runs/maxtext   # one chart, a curve per run
                                                        # -> runs/comparison/*.png

Reads ``RUN_DIR/logs/metrics.jsonl`` (written by ``CompositeLogger``'s ``jsonl``
sink) with matplotlib's file-only Agg backend, so it works without a display.
Charts whose metrics were never logged are left out. With several runs each chart
draws every run in its own colour (training loss solid, eval loss dashed), labelled
with the run directory's name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from baton.callbacks.sinks.jsonl import FILE_NAME, read_jsonl

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: chart file stem -> (title, y label, metric keys drawn on it)
CHARTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "loss": ("Loss", "loss", ("loss", "eval/loss")),
    "lr": ("Learning rate", "learning rate", ("optim/lr", "lr")),
    "throughput": ("Throughput", "tokens / s", ("throughput/tokens_per_s",)),
}


def plot_run(run_dir: Path, out_dir: Path) -> list[Path]:
    """Write one PNG per chart with data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(run_dir / "logs" / FILE_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, (title, ylabel, keys) in CHARTS.items():
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        drawn = False
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if not points or (drawn and stem == "lr"):
                continue  # one learning-rate series is enough
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker=marker(len(points), few=30), label=key)
            drawn = True
        if drawn:
            ax.set(title=f"{title} - {run_dir.name}", xlabel="step", ylabel=ylabel)
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            path = out_dir / f"{stem}.png"
            fig.savefig(path)
            written.append(path)
        plt.close(fig)
    return written


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's name on the charts: its directory name, or its path where names repeat."""
    names = [run_dir.name for run_dir in run_dirs]
    return [
        name if names.count(name) == 1 else str(run_dir)
        for name, run_dir in zip(names, run_dirs, strict=True)
    ]


def series(
    run_dirs: Sequence[Path], keys: Sequence[str]
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """``{run label: {metric key: (steps, values)}}`` of the keys each run logged."""
    drawn: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for label, run_dir in zip(run_labels(run_dirs), run_dirs, strict=True):
        records = read_jsonl(run_dir / "logs" / FILE_NAME)
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                steps, values = zip(*points, strict=True)
                drawn.setdefault(label, {})[key] = (list(steps), list(values))
    return drawn


def marker(points: int, few: int = 2) -> str | None:
    """A point marker for a series of fewer than ``few`` points: a line through one
    point (a run's single evaluation) draws nothing, its marker does.

    >>> marker(1), marker(40)
    ('o', None)
    """
    return "o" if points < few else None


def comparison_chart(stem: str, run_dirs: Sequence[Path]) -> Figure | None:
    """The chart ``stem`` (``loss``, ``lr``, ``throughput``) with every run's series in
    the run's colour (eval dashed); ``None`` when no run logged its metrics. Every
    series listed in the legend is drawn (one point as a marker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, ylabel, keys = CHARTS[stem]
    runs = series(run_dirs, keys)
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for index, (label, by_key) in enumerate(runs.items()):
        colour = f"C{index % 10}"
        for number, (key, (steps, values)) in enumerate(by_key.items()):
            if number and stem == "lr":
                break  # one learning-rate series per run is enough
            style = "--" if key.startswith("eval/") else "-"
            name = label if key == keys[0] or stem == "lr" else f"{label} ({key})"
            ax.plot(steps, values, style, color=colour, label=name, marker=marker(len(steps)))
    ax.set(title=f"{title} - {len(run_dirs)} runs", xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_runs(run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """One PNG per chart with every run's curves on it; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem in CHARTS:
        fig = comparison_chart(stem, run_dirs)
        if fig is None:
            continue
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _comparison_dir(run_dirs: Sequence[Path]) -> Path:
    import os

    parent = Path(os.path.commonpath([run_dir.resolve().parent for run_dir in run_dirs]))
    return parent / "comparison"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton plot", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="run directories (runs/<name>)")
    parser.add_argument(
        "--out",
        type=Path,
        help="where the PNGs go (default RUN_DIR/plots; for several runs, comparison/ "
        "next to them)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    for run_dir in args.run_dirs:
        metrics = run_dir / "logs" / FILE_NAME
        if not metrics.is_file():
            print(
                f"baton plot: {metrics} not found; log with CompositeLogger(['jsonl', ...]) "
                "to write it",
                file=sys.stderr,
            )
            return 2
    if len(args.run_dirs) == 1:
        run_dir = args.run_dirs[0]
        written = plot_run(run_dir, args.out or run_dir / "plots")
    else:
        written = plot_runs(args.run_dirs, args.out or _comparison_dir(args.run_dirs))
    if not written:
        names = ", ".join(str(run_dir / "logs" / FILE_NAME) for run_dir in args.run_dirs)
        print(f"baton plot: {names}: no loss, lr or throughput values", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
