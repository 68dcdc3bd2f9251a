"""A TorchTitan GRPO run SIGKILLed after its step-3 checkpoint and resumed reaches the
uninterrupted run's weights and optimizer state at step 6 bit for bit, having sampled
the same completions: the rollout phase's state (prompt order, the sampler's random
state, the batch of ``--num-iterations 2`` not yet used up) comes back with TorchTitan's
DCP checkpoint, and the ``transformers`` generator is loaded with the restored weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from support.grpo import learning_flags
from support.states import assert_bitwise_equal

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "recipes" / "torchtitan_llama3_debug.py"


def model_and_optimizer(checkpoint: Path) -> dict[str, dict]:
    """The DCP checkpoint's model and optimizer tensors, whole, by key."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from baton.backends.torchtitan.export import dcp_folder

    folder = dcp_folder(checkpoint)
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    model = {k: v for k, v in state.items() if not k.startswith(("optimizer", "lr_scheduler"))}
    optimizer = {k: v for k, v in state.items() if k.startswith("optimizer")}
    assert model and optimizer
    return {"model": model, "optimizer": optimizer}


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "logs" / "rollouts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.mark.slow
def test_a_killed_grpo_run_resumes_bitwise(grpo_assets, tmp_path):
    flags = [
        *learning_flags(grpo_assets["files"], max_prompt_length=24, num_iterations=2),
        "--batch-size", "16", "--lr", "5e-3", "--min-lr", "5e-3", "--warmup-steps", "0",
        "--seq-len", "32", "--log-every", "1", "--save-every", "3", "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    run = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE), *flags]
    straight = tmp_path / "straight"
    done = subprocess.run([*run, "--max-steps", "6", "--run-dir", str(straight)],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    killer = ROOT / "tests" / "support" / "killed_run.py"
    done = subprocess.run(
        [sys.executable, str(killer), "--saved", "3", "--next-save", "6", str(RECIPE), *flags,
         "--max-steps", "6", "--run-dir", str(killed)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:] + done.stderr[-3000:]
    done = subprocess.run([*run, "--max-steps", "6", "--run-dir", str(killed), "--resume", "auto"],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr

    a = model_and_optimizer(straight / "checkpoints" / "step_000006")
    b = model_and_optimizer(killed / "checkpoints" / "step_000006")
    for part in ("model", "optimizer"):
        assert_bitwise_equal(a[part], b[part], part)
    # the same completions, each once: steps 1 and 3 before the kill, 5 after it
    assert records(straight) == records(killed)
    assert sorted({r["step"] for r in records(killed)}) == [1, 3, 5]
