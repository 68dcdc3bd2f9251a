"""Scale-out through the engines users already run: a real SLURM cluster (``baton
submit``, the time-limit signal, requeue) and torchrun's elastic restarts.

Every run trains the same tiny GPT data parallel on two CPU ranks and must end with
weights and optimizer state bitwise equal to one uninterrupted two-rank run.
``BATON_TEST_SEED`` fixes the random kill step of the elastic test (printed on failure).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.core.checkpoints import files as ckpt
from support.processes import run_job
from support.slurm import SlurmCluster, slurm_available
from support.states import assert_bitwise_equal, load_state
from support.torchrun import torchrun_nodes

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).with_name("recipe_ddp.py")
STEPS = 20


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


def _torchrun(run_dir: Path, *args: str, restarts: int = 0) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", str(restarts), "-m", "baton.core.cli.command", "run", str(RECIPE),
        "--run-dir", str(run_dir), "--max-steps", str(STEPS), *args,
    ]  # fmt: skip
    return run_job(command, _env(), timeout=600)


def _final_state(run_dir: Path) -> dict:
    return load_state(run_dir / "checkpoints" / ckpt.checkpoint_name(STEPS))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted two-rank run."""
    run_dir = tmp_path_factory.mktemp("reference")
    done = _torchrun(run_dir)
    assert done.returncode == 0, done.stderr[-4000:]
    return _final_state(run_dir)


def test_elastic_restart_after_a_killed_rank_is_bitwise_equal(reference, tmp_path) -> None:
    seed = int(os.environ.get("BATON_TEST_SEED", random.randrange(1 << 30)))
    kill_at = random.Random(seed).randint(6, STEPS - 2)
    done = _torchrun(tmp_path, "--die-at-step", str(kill_at), restarts=2)
    out = done.stdout + done.stderr
    where = f"BATON_TEST_SEED={seed} (kill at step {kill_at})"
    assert done.returncode == 0, f"{where}\n{out[-4000:]}"
    assert f"KILLING rank 1 at step {kill_at}" in out, where
    assert "resuming from its newest checkpoint" in out and "resumed from" in out, where
    assert_bitwise_equal(reference, _final_state(tmp_path), where)


def test_two_nodes_write_each_checkpoint_once_and_resume(reference, tmp_path) -> None:
    """Two torchrun agents (``--nnodes 2``, c10d rendezvous on 127.0.0.1), one Fabric DDP
    rank each: one checkpoint per save (rank 0 writes it), and a second two-node launch
    resumes it and ends bitwise equal to the one-node run."""
    import baton.core.cli.command

    cli = Path(baton.core.cli.command.__file__)
    args = ("run", str(RECIPE), "--run-dir", str(tmp_path))
    torchrun_nodes(cli, *args, "--max-steps", "10", nnodes=2, nproc=1)
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["latest", "step_000005", "step_000010"], saved
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000010")
    assert meta["backend"]["world_size"] == 2
    torchrun_nodes(cli, *args, "--max-steps", str(STEPS), "--resume", "auto",
                   "--allow-changed", "max_steps", nnodes=2, nproc=1)  # fmt: skip
    assert_bitwise_equal(reference, _final_state(tmp_path), "two-node resume")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    if not slurm_available():
        if os.environ.get("CI"):
            pytest.fail("SLURM daemons are missing: .ci/run installs slurm-wlm and munge")
        pytest.skip("SLURM daemons not installed (apt-get install slurm-wlm munge)")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def _submit(cluster: SlurmCluster, run_dir: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", "submit", str(RECIPE), "--run-dir",
         str(run_dir), "--max-steps", str(STEPS), "--procs-per-node", "2",
         # the one test node's cores and memory, not baton submit's per-worker defaults
         "--cpus-per-task", str(cluster.cpus), "--mem", "0", *args],
        env=cluster.env(_env()), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("submitted job ")[1].split(":")[0]


def _output(run_dir: Path, job: str) -> str:
    path = run_dir / "slurm" / f"slurm-{job}.out"
    return path.read_text() if path.exists() else ""


def test_slurm_job_of_two_ranks_trains_to_the_end(cluster, reference, tmp_path) -> None:
    job = _submit(cluster, tmp_path, "--time", "00:10:00")
    fields = cluster.wait_for_state(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"})
    out = _output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED", out[-4000:]
    assert f"STEP {STEPS} world 2" in out
    assert_bitwise_equal(reference, _final_state(tmp_path), f"slurm job {job}")


def test_slurm_time_limit_saves_requeues_and_resumes(cluster, reference, tmp_path) -> None:
    """The job starts with a long limit; once it trains, its limit is cut to one minute
    (as an admin or a shorter QOS would): SLURM signals USR1 60 s before the end, the
    run saves and requeues itself, and the requeued job resumes and finishes."""
    # 20 steps of 3 s: SLURM checks time limits every 30 s, so the signal after the cut
    # at step 3 arrives well before the run could end on its own
    job = _submit(cluster, tmp_path, "--time", "00:10:00", "--signal-lead", "60",
                  "--slow-ms", "3000")  # fmt: skip
    deadline = time.monotonic() + 180
    while "STEP 3 " not in _output(tmp_path, job):
        assert time.monotonic() < deadline, _output(tmp_path, job)[-3000:]
        time.sleep(1)
    cluster.scontrol("update", f"JobId={job}", "TimeLimit=1")
    requeued = cluster.wait_for_state(job, {"PENDING", "COMPLETED", "FAILED"}, timeout=180)
    out = _output(tmp_path, job)
    assert requeued["JobState"] == "PENDING" and requeued["Restarts"] == "1", out[-4000:]
    assert "SIGUSR1 at step" in out
    # give the requeued job its long limit back and let it start now (SLURM holds
    # requeued jobs for a while before they are eligible)
    cluster.scontrol("update", f"JobId={job}", "TimeLimit=10", "StartTime=now")
    fields = cluster.wait_for_state(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"})
    out = _output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED", out[-4000:]
    assert "(restart 1)" in out and "resumed from" in out
    assert_bitwise_equal(reference, _final_state(tmp_path), f"requeued slurm job {job}")
