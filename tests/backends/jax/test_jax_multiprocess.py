"""Two JAX processes on this host (``jax.distributed`` with a localhost coordinator from
``BATON_*`` settings, CPU collectives over gloo): data parallel over both processes,
a synchronous orbax checkpoint written by both, and a resume in two fresh processes that logs the
uninterrupted run's losses bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from backends.jax.test_jax_resume import ARGS, RECIPE, SAVE_AT, STEPS, WORKER

from support.processes import baton_rank_envs, run_together

#: no evaluation: each process compiles only the train step
MP_ARGS = [a for a in ARGS if not a.startswith("--eval-every")] + ["--eval-every=0"]


def launch_two(out: Path, *args: str) -> list[dict]:
    """The recipe as rank 0 and rank 1 of one job; both reports (fails with their output)."""
    cmd = [sys.executable, str(WORKER), str(out), str(RECIPE), *MP_ARGS, *args]
    run_together([cmd, cmd], baton_rank_envs(2), timeout=300)
    return [json.loads(Path(str(out).replace("{rank}", str(r))).read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_two_processes_train_data_parallel_save_and_resume(tmp_path):
    # synchronous saves here (the single-process resume test saves asynchronously)
    full = launch_two(
        tmp_path / "full_{rank}.json", f"--run-dir={tmp_path / 'full'}", "--no-async-save"
    )
    for rank, report in enumerate(full):
        assert (report["rank"], report["world_size"]) == (rank, 2)
        assert report["torch_modules"] == []
    losses = {int(k): v for k, v in full[0]["losses"].items()}
    assert sorted(losses) == list(range(1, STEPS + 1))
    # one loss for the global batch: both processes log the same numbers
    assert full[1]["losses"] == full[0]["losses"]
    # the global batch is both processes' batches (8 x 32 tokens each)
    assert full[0]["tokens"]["1"] == 2 * 8 * 32

    checkpoint = tmp_path / "full" / "checkpoints" / f"step_{SAVE_AT:06d}"
    backend = checkpoint / "backend"
    assert sorted(p.name for p in backend.iterdir()) == [
        "data_rank00000.json",
        "data_rank00001.json",
        "state",
    ]
    record = json.loads((checkpoint / "baton.json").read_text())["checkpoint"]
    assert record == {"layout": {"processes": 2}, "samples": SAVE_AT * 2 * 8, "data": ""}
    resumed = launch_two(
        tmp_path / "resumed_{rank}.json",
        f"--run-dir={tmp_path / 'resumed'}",
        f"--resume={checkpoint}",
    )
    for report in resumed:
        assert report["resumed_from"] == str(checkpoint)
        after = {int(k): v for k, v in report["losses"].items()}
        assert sorted(after) == list(range(SAVE_AT + 1, STEPS + 1))
        assert after == {s: losses[s] for s in after}  # bit for bit
