"""Save and resume in a fresh process: the recipe ``jax_tiny.py`` (an nnx transformer with
the standard callbacks) resumed from an asynchronous orbax checkpoint logs the same losses,
bit for bit, as the uninterrupted run, also from a checkpoint in the form written before
``baton.json`` recorded the backend's facts; neither process imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("run_recipe.py")
RECIPE = ROOT / "recipes" / "jax_tiny.py"
STEPS, SAVE_AT = 12, 6
#: a tiny transformer: each process compiles in a few seconds
ARGS = [
    f"--max-steps={STEPS}",
    f"--save-every={SAVE_AT}",
    "--log-every=1",
    "--eval-every=6",
    "--batch-size=8",
    "--seq-len=32",
    "--d-model=32",
    "--no-progress",
    "--no-print-loss",
]


def run_recipe(out: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """The recipe in a fresh interpreter; its JSON report."""
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), str(RECIPE), *ARGS, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_resume_in_fresh_process_matches_uninterrupted_run_without_torch(tmp_path):
    full = run_recipe(tmp_path / "full.json", f"--run-dir={tmp_path / 'full'}")
    assert full["torch_modules"] == [] and full["jax_loaded"]
    losses = {int(k): v for k, v in full["losses"].items()}
    assert sorted(losses) == list(range(1, STEPS + 1))
    checkpoint = tmp_path / "full" / "checkpoints" / f"step_{SAVE_AT:06d}"
    assert (checkpoint / "backend" / "state").is_dir()
    position = checkpoint / "backend" / "data_rank00000.json"
    assert json.loads(position.read_text()) == {
        "step": SAVE_AT,
        "samples": SAVE_AT * 8,
        "data": {"epoch": 0, "consumed": SAVE_AT},
        "lr_scale": 1.0,  # no callback set a learning rate
    }
    meta = json.loads((checkpoint / "baton.json").read_text())
    assert meta["checkpoint"] == {"layout": {"processes": 1}, "samples": SAVE_AT * 8, "data": ""}
    # as main wrote it before baton.json recorded the facts: a side file, no samples
    (checkpoint / "backend" / "baton_jax.json").write_text(
        json.dumps({"layout": "baton-jax-v1", "step": SAVE_AT, "processes": 1, "model": "nnx"})
    )
    position.write_text(json.dumps({"step": SAVE_AT, "data": {"epoch": 0, "consumed": SAVE_AT}}))
    meta.pop("checkpoint")
    meta["files"].pop("data_rank00000.json")  # its size changed
    (checkpoint / "baton.json").write_text(json.dumps(meta))

    resumed = run_recipe(
        tmp_path / "resumed.json", f"--run-dir={tmp_path / 'resumed'}", f"--resume={checkpoint}"
    )
    assert resumed["resumed_from"] == str(checkpoint)
    assert resumed["torch_modules"] == []
    after = {int(k): v for k, v in resumed["losses"].items()}
    assert sorted(after) == list(range(SAVE_AT + 1, STEPS + 1))
    assert after == {s: losses[s] for s in after}  # bit for bit
