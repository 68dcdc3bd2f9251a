"""GRPO on MaxText under parallel layouts (``grpo_layout_run.py``, fresh processes), on the
fixed rollouts: FSDP over 2 simulated CPU devices with MaxText's gradient accumulation
over 2 micro-batches, and two JAX processes (the first samples the rollouts and
broadcasts them; FSDP over both). Each layout's first step's loss and gradient norm
equal one device's (FSDP's also TRL's): the loss is one mean over the completion tokens
of the global batch, whatever splits it. ``gather_weights()`` on each layout gives the
whole tensors ``baton export`` writes from the same step's checkpoint, and one device's.

The two processes start from a checkpoint of the one-device run (a policy whose
architecture the checkpoint records: the generator's is a temporary ``config.json``):
``--init-from HF_DIR`` converts the weights in the recipe, before ``jax.distributed``
starts, in the process itself (one process, or ``--devices``) only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("maxtext")

from safetensors.numpy import load_file

from support.maxtext_grpo import GatheredWeights, grpo_argv, run_grpo
from support.processes import baton_rank_envs, run_together

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
LAYOUT_RUN = HERE / "grpo_layout_run.py"
QUIET = ("--save-every", "0", "--no-callback", "checkpoint")


def first_step(argv: list[str]) -> dict[str, Any]:
    """One device's first step: its metrics and the weights gathered after it."""
    gathered = GatheredWeights()
    _, logged = run_grpo(argv, gathered)
    return {"metrics": logged.metrics[1], "gathered": gathered.values[1]}


@pytest.fixture(scope="module")
def one_device(qwen3_grpo_assets, tmp_path_factory) -> dict[str, Any]:
    """The first step on one device from the policy, and its checkpoint."""
    run_dir = tmp_path_factory.mktemp("grpo-one") / "run"
    saves = ("--save-every", "1", "--no-async-save")
    step = first_step(grpo_argv(qwen3_grpo_assets["files"], run_dir, extra=saves))
    return {**step, "checkpoint": run_dir / "checkpoints" / "step_000001"}


def files_json(assets: dict[str, Any], directory: Path) -> Path:
    listed = directory / "files.json"
    listed.write_text(json.dumps({name: str(path) for name, path in assets["files"].items()}))
    return listed


def check_layout(
    start: dict[str, np.ndarray], one_device: dict[str, Any], report: dict[str, Any], run_dir: Path
) -> None:
    """The layout's first step (from the weights ``start``) is one device's; its gathered
    weights are the export of its checkpoint, and one device's."""
    from baton.tools.export import main as export

    one = one_device["metrics"]
    print(f"layout: loss {report['loss']!r} grad_norm {report['grad_norm']!r}; "
          f"one device: loss {one['loss']!r} grad_norm {one['grad_norm']!r}")  # fmt: skip
    assert report["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert report["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name in ("entropy", "clip_ratio/region_mean", "reward"):
        assert report[name] == pytest.approx(one[name], rel=1e-5), name

    export_dir = run_dir.parent / "export"
    checkpoint = run_dir / "checkpoints" / "step_000001"
    assert export([str(checkpoint), str(export_dir), "--format", "hf"]) == 0
    exported = load_file(str(export_dir / "model.safetensors"))
    gathered = load_file(str(run_dir / "gathered.safetensors"))
    assert sorted(gathered) == sorted(exported) == sorted(one_device["gathered"])
    # one Adam step moves every weight by about the learning rate; where a gradient is
    # near Adam's eps (1e-8) the two layouts' rounding moves it by more or less: the
    # layouts' updates agree to 1% (a misplaced shard would differ by 100%)
    for name, value in exported.items():
        np.testing.assert_array_equal(gathered[name], value, err_msg=name)
        alone = one_device["gathered"][name]
        update = np.linalg.norm(alone - start[name])
        assert np.linalg.norm(gathered[name] - alone) <= 1e-2 * update, name


def test_fsdp_2_with_accumulation_gives_one_devices_first_step(
    qwen3_grpo_assets, one_device, tmp_path
):
    out, run_dir = tmp_path / "report.json", tmp_path / "mesh"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    listed = files_json(qwen3_grpo_assets, tmp_path)
    done = subprocess.run(
        [sys.executable, str(LAYOUT_RUN), str(out), str(run_dir), str(listed), "fsdp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert (report["devices"], report["fsdp"]) == (2, 2)
    policy = qwen3_grpo_assets["files"]["policy"]
    check_layout(load_file(str(policy / "model.safetensors")), one_device, report, run_dir)
    trl = qwen3_grpo_assets["reference"](loss_type="dapo", beta=0.0)[0]
    assert report["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert report["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)


def test_two_processes_give_one_devices_first_step(qwen3_grpo_assets, one_device, tmp_path):
    """The first process samples and broadcasts the rollouts; both train on them and
    join the gathering of the weights, which only the first keeps."""
    checkpoint = str(one_device["checkpoint"])
    argv = grpo_argv(qwen3_grpo_assets["files"], tmp_path / "one", extra=QUIET)
    argv[argv.index("--init-from") + 1] = checkpoint
    alone = first_step(argv)
    run_dir = tmp_path / "ranks"
    listed = files_json(qwen3_grpo_assets, tmp_path)
    command = [
        sys.executable, str(LAYOUT_RUN), str(tmp_path / "report_{rank}.json"), str(run_dir),
        str(listed), "processes", checkpoint,
    ]  # fmt: skip
    envs = [{k: v for k, v in env.items() if k != "XLA_FLAGS"} for env in baton_rank_envs(2)]
    run_together([command, command], envs, timeout=900)
    first, second = (json.loads((tmp_path / f"report_{r}.json").read_text()) for r in (0, 1))
    assert (first["processes"], first["fsdp"]) == (2, 2)
    assert (first["gathered"], second["gathered"]) == ([1], [])
    for name in ("loss", "grad_norm", "reward", "entropy"):
        assert second[name] == first[name], name  # one global batch, one loss
    check_layout(one_device["gathered"], alone, first, run_dir)
