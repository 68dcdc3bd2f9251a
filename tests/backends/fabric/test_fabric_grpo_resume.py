"""A Fabric GRPO run killed and resumed ends as the run that was never stopped, bit for
bit: the same completions sampled (``logs/rollouts.jsonl``), the same losses logged and
the same weights and optimizer state. The rollout phase's state (the prompt order, the
sampler's random state, a batch not yet used up) travels in every checkpoint; the
``transformers`` generator samples with the weights gathered from the backend.

Both runs are the learning task of ``support.grpo`` (real sampling), checkpointed every
few steps and SIGKILLed after a save (``support/killed_run.py``), then resumed with
``--resume auto``. With ``--num-iterations 2`` the kill comes mid-cycle: the resumed
run's first step trains on the buffered batch the checkpoint holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.grpo import learning_flags

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
#: what a step logs that training decides (not its times)
TRAINED = ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "reward", "reward_std")


def logged(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").open()]
    return {row["step"]: {k: row[k] for k in TRAINED} for row in rows if "loss" in row}


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(("iterations", "save_every"), [(1, 2), (2, 3)])
def test_grpo_killed_after_a_save_resumes_bitwise(grpo_assets, tmp_path, iterations, save_every):
    """``--num-iterations 1``: saved at step 2, killed after it, resumed to step 6.
    ``--num-iterations 2``: saved at step 3 (the rollouts sampled at step 3 are trained
    on again at step 4), killed after it, resumed to step 6."""
    from support.states import assert_bitwise_equal, load_state

    flags = [
        *learning_flags(grpo_assets["files"], max_prompt_length=24,
                        num_iterations=iterations),
        "--batch-size", "16", "--lr", "5e-3", "--seq-len", "32", "--log-every", "1",
        "--save-every", str(save_every), "--no-progress",
    ]  # fmt: skip
    cli = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE), *flags]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = run([*cli, "--max-steps", "6", "--run-dir", str(straight)])
    assert done.returncode == 0, done.stderr[-3000:]

    killer = ROOT / "tests" / "support" / "killed_run.py"
    done = run([sys.executable, str(killer), "--saved", str(save_every), "--next-save",
                str(2 * save_every), str(RECIPE), *flags, "--max-steps", "1000",
                "--run-dir", str(killed)])  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:] + done.stderr[-3000:]
    done = run([*cli, "--max-steps", "6", "--run-dir", str(killed), "--resume", "auto",
                "--allow-changed", "max_steps"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout + done.stderr

    rollouts = [d / "logs" / "rollouts.jsonl" for d in (straight, killed)]
    assert rollouts[0].read_bytes() == rollouts[1].read_bytes()
    steps = {json.loads(line)["step"] for line in rollouts[0].open()}
    assert steps == set(range(1, 7, iterations))  # sampled every num_iterations steps
    want, got = logged(straight), logged(killed)
    assert sorted(want) == list(range(1, 7)) and got == want
    a = load_state(straight / "checkpoints" / "step_000006")
    b = load_state(killed / "checkpoints" / "step_000006")
    for part in ("model", "optimizer"):
        assert_bitwise_equal(a[part], b[part], part)
