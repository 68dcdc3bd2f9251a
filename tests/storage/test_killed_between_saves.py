"""A run killed (SIGKILL) between two asynchronous saves resumes from the first: the
save completes (rename, ``latest``, upload) as soon as its write is done, not when the
next save starts. Megatron-Core with its checkpoints in a bucket (a resume on an empty
run directory), and the JAX backend on its local disk."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from baton.callbacks.object_store import ObjectStore

ROOT = Path(__file__).parents[2]
KILLED_RUN = ROOT / "tests" / "support" / "killed_run.py"


def killed_run(env: dict[str, str], recipe: str, *args: str, bucket: str = "") -> str:
    """The recipe's run, killed once the checkpoint of step 10 is complete (in
    ``bucket`` too) and before the save of step 20 starts."""
    command = [sys.executable, str(KILLED_RUN), "--saved", "10", "--next-save", "20",
               "--bucket", bucket, str(ROOT / "recipes" / recipe), *args,
               "--save-every", "10", "--max-steps", "1000"]  # fmt: skip
    done = subprocess.run(command, env=env, text=True, capture_output=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == -signal.SIGKILL, out
    assert "step_000010 complete" in out
    return out


def resumed_run(env: dict[str, str], recipe: str, *args: str) -> str:
    command = [sys.executable, "-m", "baton.core.cli.command", "run", str(ROOT / "recipes" / recipe),
               *args, "--max-steps", "12", "--resume", "auto", "--allow-changed", "max_steps"]  # fmt: skip
    done = subprocess.run(command, env=env, text=True, capture_output=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_megatron_killed_between_saves_resumes_from_the_bucket(s3, tmp_path):
    url = f"s3://{s3.new_bucket()}/run"
    run_dir = tmp_path / "run"
    flags = ("--run-dir", str(run_dir), "--log-every", "5", "--eval-every", "0",
             "--no-progress", "--checkpoint-upload", url)  # fmt: skip
    killed_run(s3.env, "megatron_gpt_tiny.py", *flags, bucket=url)
    assert ObjectStore.open(url).latest() == "step_000010"
    shutil.rmtree(run_dir)  # the machine is gone: only the bucket is left

    out = resumed_run(s3.env, "megatron_gpt_tiny.py", *flags)
    assert "fetched checkpoint" in out
    assert "resumed from" in out and "step_000010 at step 10" in out


def test_jax_killed_between_saves_resumes_from_its_disk(s3, tmp_path):
    run_dir = tmp_path / "run"
    flags = ("--run-dir", str(run_dir), "--log-every", "5", "--eval-every", "0",
             "--no-progress", "--batch-size", "4", "--seq-len", "32")  # fmt: skip
    killed_run(s3.env, "jax_tiny.py", *flags)
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest").resolve().name == "step_000010"
    assert not (checkpoints / "step_000020").exists()

    out = resumed_run(s3.env, "jax_tiny.py", *flags)
    assert "resumed from" in out and "step_000010 at step 10" in out
    assert (checkpoints / "latest").resolve().name == "step_000012"
