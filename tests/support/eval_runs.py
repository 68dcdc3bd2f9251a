"""Train a recipe for a few steps with evaluation, then ``baton eval`` its checkpoint,
each in a fresh process, and read both ``eval/loss`` values from the output.

Example::

    logged, printed = train_then_eval("recipes/maxtext_tiny.py", ["--eval-split", "0.05"],
                                      tmp_path / "run")
    assert printed == pytest.approx(logged, abs=1e-3)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}


def baton(*args: str, timeout: int = 600) -> str:
    """Run ``baton ARGS`` in a fresh interpreter; its stdout (stderr on failure)."""
    out = subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | ENV,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def train_then_eval(
    recipe: str, args: Sequence[str], run_dir: Path, *, steps: int = 2
) -> tuple[float, float]:
    """``(eval/loss logged at the last step of a run, eval/loss that baton eval prints
    for that run's last checkpoint)``, both with ``args`` (the data and its split)."""
    trained = baton(
        "run", recipe, *args, "--max-steps", str(steps), "--eval-every", str(steps),
        "--log-every", "1", "--no-progress", "--run-dir", str(run_dir),
    )  # fmt: skip
    logged = re.findall(rf"eval +{steps} \| eval/loss ([0-9.]+)", trained)
    assert logged, trained[-2000:]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert checkpoints, f"no checkpoint in {run_dir}"
    evaluated = baton(
        "eval", recipe, "--checkpoint", str(checkpoints[-1]), *args, "--no-progress",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    printed = re.findall(r"^eval/loss ([0-9.]+)$", evaluated, re.MULTILINE)
    assert printed, evaluated[-2000:]
    return float(logged[-1]), float(printed[-1])
