"""``baton goodput RUN_DIR``: where the run's wall time went, across all its attempts.

Example::

    baton goodput runs/quickstart          # the table, and runs/quickstart/plots/goodput.png
    baton goodput runs/quickstart --out /tmp/charts

Reads ``RUN_DIR/goodput.jsonl`` (written by the ``Goodput`` callback) and prints one
row per category (seconds, share of the wall time) with the steps first completed and
redone, then writes a chart: one stacked bar per attempt (the time before it, since
the previous attempt's last record, included in that bar).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from baton.callbacks.goodput_ledger import (
    CATEGORIES,
    LEDGER_FILE,
    MEANING,
    Summary,
    read_ledger,
    summarise,
)


def table(summary: Summary) -> str:
    """The summary as aligned text: one row per category, then the totals."""
    wall = summary.wall_s or 1.0
    rows = [f"{'category':<18}{'seconds':>11}{'share':>8}  meaning"]
    for name in CATEGORIES:
        seconds = summary.seconds.get(name, 0.0)
        rows.append(f"{name:<18}{seconds:>11.2f}{seconds / wall:>8.1%}  {MEANING[name]}")
    attributed = sum(summary.seconds.values())
    rows.append(f"{'total':<18}{attributed:>11.2f}{attributed / wall:>8.1%}")
    rows.append(
        f"wall {summary.wall_s:.2f} s over {len(summary.attempts)} attempt(s); "
        f"goodput {summary.goodput:.1%}; steps first completed {summary.steps['new']}, "
        f"redone {summary.steps['redone']}"
    )
    return "\n".join(rows)


def chart(summary: Summary, path: Path, title: str) -> Path:
    """One stacked bar per attempt, a colour per category; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{i + 1}" for i in range(len(summary.attempts))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    bottoms = [0.0] * len(summary.attempts)
    for index, name in enumerate(CATEGORIES):
        values = [a.seconds.get(name, 0.0) for a in summary.attempts]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, label=name, color=f"C{index % 10}")
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set(
        title=f"Goodput {summary.goodput:.1%} - {title}",
        xlabel="attempt",
        ylabel="seconds",
    )
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="baton goodput", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (runs/<name>)")
    parser.add_argument("--out", type=Path, help="where the PNG goes (default RUN_DIR/plots)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    records = read_ledger(args.run_dir)
    if not records:
        print(
            f"baton goodput: {args.run_dir / LEDGER_FILE} not found or empty; add the "
            "Goodput callback to the recipe's callbacks to keep the ledger",
            file=sys.stderr,
        )
        return 2
    summary = summarise(records)
    print(table(summary))
    print(chart(summary, (args.out or args.run_dir / "plots") / "goodput.png", args.run_dir.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
