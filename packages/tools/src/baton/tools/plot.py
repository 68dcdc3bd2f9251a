"""``baton plot RUN_DIR``: PNG charts of loss, learning rate and throughput.

Example::

    baton plot runs/quickstart            # -> runs/quickstart/plots/*.png
    baton plot runs/quickstart --out /tmp/charts

Reads ``RUN_DIR/logs/metrics.jsonl`` (written by ``CompositeLogger``'s ``jsonl``
sink) with matplotlib's file-only Agg backend, so it works without a display.
Charts whose metrics were never logged are left out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from baton.callbacks.sinks.jsonl import FILE_NAME, read_jsonl

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
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton plot", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<name>)")
    parser.add_argument("--out", type=Path, help="where the PNGs go (default RUN_DIR/plots)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    metrics = args.run_dir / "logs" / FILE_NAME
    if not metrics.is_file():
        print(
            f"baton plot: {metrics} not found; log with CompositeLogger(['jsonl', ...]) "
            "to write it",
            file=sys.stderr,
        )
        return 2
    written = plot_run(args.run_dir, args.out or args.run_dir / "plots")
    if not written:
        print(f"baton plot: {metrics} has no loss, lr or throughput values", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
