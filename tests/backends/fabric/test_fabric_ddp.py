"""Two CPU processes under torchrun: DDP through Fabric, flags agreed at the log cadence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.slow
def test_two_ranks_agree_on_weights_and_stop(tmp_path):
    torchrun(WORKER, str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    assert ranks[0]["step"] == ranks[1]["step"] == 4
    assert ranks[1]["reason"] == "rank 1 asked"
    assert ranks[0]["reason"] == "requested on another rank"
    assert ranks[0]["param_hash"] == ranks[1]["param_hash"]


@pytest.mark.slow
def test_fabric_starts_its_own_processes_without_torchrun(tmp_path: Path) -> None:
    """FabricConfig(devices=2) under plain `baton run`: Fabric re-runs the command for
    rank 1, which must not take the run directory's lock its parent holds."""
    import os
    import subprocess
    import sys

    recipe = Path(__file__).with_name("recipe_fabric_devices.py")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", "run", str(recipe), "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in use by another baton run" not in done.stderr
    record = json.loads((run_dir / "run.json").read_text())
    assert record["world_size"] == 2 and record["launch"]["source"] == "lightning"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [
        "step_000004",
        "step_000008",
    ]


@pytest.mark.slow
def test_rollback_under_ddp_replays_bitwise(tmp_path: Path) -> None:
    """8 steps straight vs. 6 steps, a rollback to step 4 and a replay to 8: the same
    weights on both ranks, and the replayed steps' losses equal the originals."""
    worker = Path(__file__).with_name("rollback_ddp_worker.py")
    for mode in ("uninterrupted", "rollback"):
        torchrun(worker, str(tmp_path), mode)
    for rank in (0, 1):
        straight = json.loads((tmp_path / f"uninterrupted_rank{rank}.json").read_text())
        replayed = json.loads((tmp_path / f"rollback_rank{rank}.json").read_text())
        assert straight["step"] == replayed["step"] == 8
        steps = [step for step, _ in replayed["losses"]]
        assert steps == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]  # the rollback happened
        assert replayed["losses"][:6] + replayed["losses"][8:] == straight["losses"]
        assert replayed["losses"][4:6] == replayed["losses"][6:8]
        assert replayed["param_hash"] == straight["param_hash"]
