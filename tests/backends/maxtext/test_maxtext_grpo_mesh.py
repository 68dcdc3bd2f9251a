"""GRPO on MaxText under a parallel layout: FSDP over 2 simulated CPU devices with
MaxText's gradient accumulation over 2 micro-batches (``grpo_mesh_run.py``, a fresh
process), on the fixed rollouts. Its first step's loss and gradient norm equal one
device's (and TRL's): the loss is one mean over the completion tokens of the global
batch, whatever splits it. ``gather_weights()`` on that layout gives the whole tensors
``baton export`` writes from the same step's checkpoint, and the one device's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("maxtext")

from safetensors.numpy import load_file

from support.maxtext_grpo import GatheredWeights, grpo_argv, run_grpo

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def test_fsdp_2_with_accumulation_gives_one_devices_first_step(qwen3_grpo_assets, tmp_path):
    from baton.tools.export import main as export

    files = qwen3_grpo_assets["files"]
    listed = tmp_path / "files.json"
    listed.write_text(json.dumps({name: str(path) for name, path in files.items()}))
    out, mesh_dir = tmp_path / "report.json", tmp_path / "mesh"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(HERE / "grpo_mesh_run.py"), str(out), str(mesh_dir), str(listed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    mesh = json.loads(out.read_text())
    assert (mesh["devices"], mesh["fsdp"]) == (2, 2)

    gathered = GatheredWeights()
    quiet = ("--save-every", "0", "--no-callback", "checkpoint")
    argv = grpo_argv(files, tmp_path / "one", extra=quiet)
    _, logged = run_grpo(argv, gathered)
    one = logged.metrics[1]
    print(f"fsdp 2: loss {mesh['loss']!r} grad_norm {mesh['grad_norm']!r}; "
          f"one device: loss {one['loss']!r} grad_norm {one['grad_norm']!r}")  # fmt: skip
    assert mesh["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert mesh["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name in ("entropy", "clip_ratio/region_mean", "reward"):
        assert mesh[name] == pytest.approx(one[name], rel=1e-5), name
    trl = qwen3_grpo_assets["reference"](loss_type="dapo", beta=0.0)[0]
    assert mesh["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert mesh["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)

    export_dir = tmp_path / "export"
    checkpoint = mesh_dir / "checkpoints" / "step_000001"
    assert export([str(checkpoint), str(export_dir), "--format", "hf"]) == 0
    exported = load_file(str(export_dir / "model.safetensors"))
    on_mesh = load_file(str(mesh_dir / "gathered.safetensors"))
    assert sorted(on_mesh) == sorted(exported) == sorted(gathered.values[1])
    # one Adam step moves every weight by about the learning rate; where a gradient is
    # near Adam's eps (1e-8) the two layouts' rounding moves it by more or less: the
    # layouts' updates agree to 1% (a misplaced shard would differ by 100%)
    start = load_file(str(files["policy"] / "model.safetensors"))
    for name, value in exported.items():
        np.testing.assert_array_equal(on_mesh[name], value, err_msg=name)
        one_device = gathered.values[1][name]
        update = np.linalg.norm(one_device - start[name])
        assert np.linalg.norm(on_mesh[name] - one_device) <= 1e-2 * update, name
