"""MaxText with two JAX processes on this host: ``jax.distributed`` from ``BATON_*``
settings (localhost coordinator, CPU collectives over gloo), the mesh's fsdp axis across
both processes, an orbax checkpoint written by both, and a resume in two fresh
processes that logs the uninterrupted run's losses bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from support.processes import baton_rank_envs, run_together

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parents[2] / "recipes" / "maxtext_tiny.py"
ARGS = ["--max-steps=6", "--log-every=1", "--eval-every=0", "--no-progress", "--no-print-loss"]
SAVE_AT = 3


def launch_two(out: Path, *args: str) -> list[dict[str, Any]]:
    """The recipe as rank 0 and rank 1 of one job; both reports (fails with their output)."""
    command = [sys.executable, str(HERE / "run_recipe.py"), str(out), str(RECIPE), *ARGS, *args]
    envs = [{k: v for k, v in env.items() if k != "XLA_FLAGS"} for env in baton_rank_envs(2)]
    run_together([command, command], envs, timeout=600)
    return [json.loads(Path(str(out).replace("{rank}", str(r))).read_text()) for r in (0, 1)]


def test_two_processes_train_save_and_resume(tmp_path: Path) -> None:
    full = launch_two(
        tmp_path / "full_{rank}.json", f"--save-every={SAVE_AT}", f"--run-dir={tmp_path / 'full'}"
    )
    for rank, report in enumerate(full):
        assert (report["rank"], report["world_size"]) == (rank, 2)
    losses = {int(k): v for k, v in full[0]["losses"].items()}
    assert sorted(losses) == list(range(1, 7))
    assert full[1]["losses"] == full[0]["losses"]  # one loss for the global batch
    assert losses[6] < losses[1] - 1.0

    backend = tmp_path / "full" / "checkpoints" / f"step_{SAVE_AT:06d}" / "backend"
    layout = json.loads((backend.parent / "baton.json").read_text())["checkpoint"]["layout"]
    assert layout["processes"] == 2 and layout["mesh"] == {"fsdp": 2}
    items = backend / "checkpoint" / str(SAVE_AT - 1) / "items"
    assert {p.name for p in items.glob("ocdbt.process_*")} == {"ocdbt.process_0", "ocdbt.process_1"}

    resumed = launch_two(
        tmp_path / "resumed_{rank}.json",
        "--save-every=0",
        "--no-callback=checkpoint",
        f"--run-dir={tmp_path / 'resumed'}",
        f"--resume={backend.parent}",
    )
    for report in resumed:
        again = {int(k): v for k, v in report["losses"].items()}
        assert again == {s: losses[s] for s in range(SAVE_AT + 1, 7)}  # bit for bit
