"""The quickstart, unchanged, under ``torchrun --nproc-per-node 2``: devices, strategy and
nodes come from the launcher; each rank reads its own shard of the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

ROOT = Path(__file__).resolve().parents[3]
CLI = ROOT / "packages" / "core" / "src" / "baton" / "core" / "cli" / "command.py"


@pytest.mark.slow
def test_quickstart_under_torchrun_two_ranks(tmp_path):
    run_dir = tmp_path / "qs"
    torchrun(
        CLI, "run", str(ROOT / "recipes" / "quickstart.py"),
        "--max-steps", "6", "--log-every", "3", "--eval-every", "6", "--save-every", "6",
        "--layers", "1", "--d-model", "32", "--seq-len", "32", "--batch-size", "4",
        "--no-progress", "--run-dir", str(run_dir),
    )  # fmt: skip
    meta = json.loads((run_dir / "checkpoints" / "step_000006" / "baton.json").read_text())
    assert meta["backend"]["world_size"] == 2
    assert meta["tokens"] == 6 * 2 * 4 * 32  # both ranks' batches counted
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").open()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 2 and all(0 < loss < 10 for loss in losses)
    assert any("eval/loss" in row for row in rows)
