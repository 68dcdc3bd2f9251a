"""Reliability of checkpoint + resume through the real CLI, in fresh processes.

A SIGKILLed run resumed with ``--resume auto`` and a SIGTERMed (preempted) run resumed
both end with weights and optimizer state bitwise equal to an uninterrupted run. The
SIGKILL step is random; a failure prints its seed, and ``BATON_KILL_SEED=N pytest
tests/callbacks/test_reliability.py`` replays it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.checkpoints import files as ckpt

from .conftest import (
    assert_bitwise_equal,
    cli_command,
    cli_env,
    fit_in_process,
    load_state,
    run_cli,
)

pytestmark = pytest.mark.slow

STEPS = 30
#: the seed of the SIGKILL test's random kill step, to replay a failure
KILL_SEED_ENV = "BATON_KILL_SEED"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run (in this process: the same code, one thread, no signals)."""
    run_dir = tmp_path_factory.mktemp("reference")
    fit_in_process(run_dir, "--max-steps", str(STEPS))
    return run_dir


def _run_until(run_dir: Path, stop_at: int, sig: signal.Signals, *args: str) -> tuple[int, str]:
    """Start a run, send ``sig`` once it printed ``STEP stop_at``; returns (rc, output)."""
    proc = subprocess.Popen(
        cli_command(run_dir, "--max-steps", str(STEPS), "--slow-ms", "30", *args),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.strip() == f"STEP {stop_at}":
                proc.send_signal(sig)
                break
        else:
            pytest.fail(f"the run ended before step {stop_at}: {proc.communicate()[1]}")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout + stderr


def kill_seed() -> int:
    """``BATON_KILL_SEED=N pytest ...`` replays a run; otherwise a fresh random seed."""
    given = os.environ.get(KILL_SEED_ENV)
    return int(given) if given else random.randrange(1 << 30)


def test_sigkill_then_resume_auto_is_bitwise_equal(reference: Path, tmp_path: Path) -> None:
    seed = kill_seed()
    kill_at = random.Random(seed).randint(11, STEPS - 2)
    # on any failure: which step was killed and how to replay exactly this case
    replay = f"killed at step {kill_at}; replay with {KILL_SEED_ENV}={seed}"
    run_dir = tmp_path / "killed"
    rc, stderr = _run_until(run_dir, kill_at, signal.SIGKILL, "--async-save")
    assert rc == -signal.SIGKILL, f"{replay}: rc {rc}\n{stderr}"
    before = [p.name for p in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert before, f"{replay}: no checkpoint before the kill"

    done = run_cli(run_dir, "--max-steps", str(STEPS), "--async-save", "--resume", "auto")
    assert done.returncode == 0, f"{replay}\n{done.stderr}"
    assert "resumed from" in done.stdout + done.stderr, f"{replay}\n{done.stdout}{done.stderr}"
    final = run_dir / "checkpoints" / ckpt.checkpoint_name(STEPS)
    assert_bitwise_equal(
        load_state(reference / "checkpoints" / ckpt.checkpoint_name(STEPS)),
        load_state(final),
        replay,
    )
    # rotation kept the last two, and `latest` is the final one
    names = [p.name for p in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert names == [ckpt.checkpoint_name(25), ckpt.checkpoint_name(30)], f"{replay}: {names}"
    assert ckpt.latest(run_dir / "checkpoints") == final.resolve(), replay


def test_sigterm_saves_exits_zero_and_resumes_exactly(reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "preempted"
    rc, output = _run_until(run_dir, 12, signal.SIGTERM)
    assert rc == 0, output
    assert "SIGTERM" in output and "resume with --resume auto" in output, output
    latest = ckpt.latest(run_dir / "checkpoints")
    assert latest is not None
    meta = ckpt.read_meta(latest)
    stopped_at = meta["step"]
    assert 12 <= stopped_at < STEPS and "SIGTERM" in meta["reason"], meta["reason"]

    done = run_cli(run_dir, "--max-steps", str(STEPS), "--resume", "auto")
    assert done.returncode == 0, done.stderr
    assert f"at step {stopped_at}" in done.stdout + done.stderr
    final = run_dir / "checkpoints" / ckpt.checkpoint_name(STEPS)
    assert_bitwise_equal(
        load_state(reference / "checkpoints" / ckpt.checkpoint_name(STEPS)), load_state(final)
    )
    # the metrics file continues across the stop: the same losses as the reference run
    ours = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "logs" / "metrics.jsonl")}
    ref = {r["step"]: r["loss"] for r in read_jsonl(reference / "logs" / "metrics.jsonl")}
    assert ref.keys() <= ours.keys()
    assert all(ours[s] == ref[s] for s in ref), (ours, ref)
    # baton.json recorded the recipe settings and versions
    settings = json.loads((final / "baton.json").read_text())
    assert settings["settings"]["max_steps"] == STEPS and "torch" in settings["versions"]
