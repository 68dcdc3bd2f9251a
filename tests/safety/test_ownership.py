"""One run per run directory: a lock naming its holder, no silent replacement of
checkpoints, ``--overwrite`` moving them aside, and a missing ``--resume`` path."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from baton.core import Driver
from baton.core.checkpoints.rundir import RunDirLock
from support.scalar_backend import ScalarBackend

from .conftest import RECIPE, run_recipe, snapshot

HOLD = """
import sys, time
from baton.core.checkpoints.rundir import RunDirLock
RunDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def hold_lock(run_dir) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def start_real_run(run_dir) -> subprocess.Popen[str]:
    """``baton run`` of a run that would take hours; returns once it holds the lock and
    trains."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "baton.core.cli.command",
            "run",
            str(RECIPE),
            "--run-dir",
            str(run_dir),
            *("--max-steps", "100000000", "--save-every", "10000000", "--log-every", "10000000"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    lock, deadline = run_dir / ".baton.lock", time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            training = (run_dir / "logs" / "metrics.jsonl").exists()  # past its setup
            if training and json.loads(lock.read_text())["pid"] == proc.pid:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the first run never took the lock")


def test_second_run_fails_at_once_naming_the_holder_then_runs_once_it_is_gone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = start_real_run(run_dir)
    try:
        before = snapshot(run_dir)
        started = time.monotonic()
        status, err = run_recipe(capsys, run_dir, "--resume", "auto")
        assert time.monotonic() - started < 10
        assert status == 1, err
        assert f"host {socket.gethostname()}, pid {holder.pid}" in err
        assert "in use by another baton run" in err and "--run-dir" in err
        assert "Traceback" not in err
        assert snapshot(run_dir) == before
    finally:
        holder.send_signal(signal.SIGKILL)  # a crashed holder: the OS drops its lock
        holder.wait()
    status, err = run_recipe(capsys, run_dir, "--resume", "auto")
    assert status == 0, err
    assert (run_dir / "checkpoints" / "step_000006").is_dir()


def test_only_global_rank_zero_takes_the_lock(tmp_path, monkeypatch):
    holder = hold_lock(tmp_path)
    try:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        driver = Driver(ScalarBackend(), max_steps=1, run_dir=tmp_path)
        driver._prepare()  # rank 1 neither waits for nor takes the lock
        assert driver._lock is None
        monkeypatch.setenv("RANK", "0")
        lock = RunDirLock(tmp_path)
        try:
            lock.acquire()
            raise AssertionError("rank 0 took a lock another process holds")
        except RuntimeError as error:
            assert str(holder.pid) in str(error)
    finally:
        holder.kill()
        holder.wait()


def test_existing_checkpoints_are_never_replaced_silently(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path)[0] == 0
    before = snapshot(tmp_path)
    status, err = run_recipe(capsys, tmp_path)
    assert status == 2, err
    assert "already holds checkpoints (newest step_000006)" in err
    assert "--resume auto" in err and "fresh --run-dir" in err and "--overwrite" in err
    assert snapshot(tmp_path) == before


def test_overwrite_moves_old_checkpoints_and_logs_aside(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path, "--max-steps", "3")[0] == 0
    old = snapshot(tmp_path / "checkpoints")
    status, err = run_recipe(capsys, tmp_path, "--overwrite")
    assert status == 0, err
    (aside,) = tmp_path.glob("checkpoints.replaced-*")
    assert snapshot(aside) == old  # renamed, not deleted or changed
    assert len(list(tmp_path.glob("logs.replaced-*"))) == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == [
        "step_000003",
        "step_000006",
    ]


def test_missing_resume_path_errors_without_creating_the_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "new"
    status, err = run_recipe(capsys, run_dir, "--resume", str(tmp_path / "nope"))
    assert status == 2, err
    assert "no checkpoint directory there" in err and "--resume auto" in err
    assert not run_dir.exists()


def test_lock_is_released_when_the_run_ends(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path, "--max-steps", "2")[0] == 0
    with RunDirLock(tmp_path):  # free again
        pass
    assert os.path.exists(tmp_path / ".baton.lock")
