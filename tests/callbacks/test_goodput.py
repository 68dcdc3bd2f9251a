"""The goodput ledger over a run killed twice (SIGKILL) and resumed, in real processes:
every second of the wall time is attributed, and redone steps count once as badput."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.callbacks.goodput_ledger import CATEGORIES, read_ledger, summarise
from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core import checkpointing as ckpt
from baton.tools.goodput import main as goodput_main

from .conftest import cli_env

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).with_name("recipe_goodput.py")
STEPS = 40


def start(run_dir: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "baton.core.cli", "run", str(RECIPE)]
    command += ["--run-dir", str(run_dir), "--max-steps", str(STEPS), "--resume", "auto"]
    return subprocess.Popen(
        command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """Wait for the run's end; returns when it printed its ``done:`` line (after its
    teardown: what follows is the interpreter's exit, outside any run) and its output."""
    assert proc.stdout is not None
    lines, done_at = [], None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("done:"):
            done_at = time.time()
    proc.wait(timeout=120)
    output = "".join(lines)
    assert proc.returncode == 0 and done_at is not None, output
    return done_at, output


def kill_after(proc: subprocess.Popen[str], step: int) -> None:
    """SIGKILL the run once the ledger holds ``step`` (it printed ``STEP step``)."""
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.strip() == f"STEP {step}":
                proc.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail(f"the run ended before step {step}: {proc.communicate()[0]}")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


def resume_step(run_dir: Path) -> int:
    latest = ckpt.latest(run_dir / "checkpoints")
    assert latest is not None, "no complete checkpoint before the kill"
    return int(ckpt.checkpoint_step(latest) or 0)


def test_killed_twice_every_second_attributed_and_redone_steps_badput(tmp_path, capsys):
    run_dir = tmp_path / "run"
    began = time.time()
    kill_after(start(run_dir), 14)
    first_resume = resume_step(run_dir)
    kill_after(start(run_dir), 27)
    second_resume = resume_step(run_dir)
    ended, _ = finish(start(run_dir))

    summary = summarise(read_ledger(run_dir))
    seconds = summary.seconds
    assert len(summary.attempts) == 3
    attributed = sum(seconds.values())
    assert attributed == pytest.approx(summary.wall_s, rel=1e-6)  # the ledger tiles its span
    # and its span is the wall time the test saw, from before the first start to the end
    # of the last run (the first process start is read from /proc, to a clock tick)
    assert attributed == pytest.approx(ended - began, rel=0.01)
    for category in CATEGORIES:
        assert seconds[category] > 0, (category, seconds)

    # each attempt resumed where `latest` was; steps up to what an earlier attempt
    # completed are redone (badput, once each), every step number is new exactly once
    assert [a.first_step for a in summary.attempts] == [0, 0, 0]
    assert summary.attempts[0].last_step == 14
    assert summary.attempts[1].last_step == 27
    assert summary.steps["new"] == STEPS
    assert summary.steps["redone"] == (14 - first_resume) + (27 - second_resume)
    ran = [14, 27 - first_resume, STEPS - second_resume]
    assert [a.steps["new"] + a.steps["redone"] for a in summary.attempts] == ran
    assert seconds["redone"] > 0 and summary.steps["redone"] >= 2

    # loggers got the running goodput
    logged = [
        r["goodput"] for r in read_jsonl(run_dir / "logs" / "metrics.jsonl") if "goodput" in r
    ]
    assert logged and all(0 < value < 1 for value in logged)

    assert goodput_main([str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert "between_attempts" in printed and "redone" in printed
    assert (run_dir / "plots" / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_goodput_without_a_ledger_names_the_callback(tmp_path, capsys):
    assert goodput_main([str(tmp_path)]) == 2
    assert "add the Goodput callback" in capsys.readouterr().err
