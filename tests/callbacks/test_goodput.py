"""The goodput ledger over a run killed twice (SIGKILL) and resumed, in real processes:
every second of the wall time is attributed, and redone steps count once as badput."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.callbacks.goodput_ledger import CATEGORIES, read_ledger, summarise
from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.checkpoints import files as ckpt
from baton.tools.goodput import main as goodput_main

from .conftest import cli_env

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).with_name("recipe_goodput.py")
STEPS = 40


def start(run_dir: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE)]
    command += ["--run-dir", str(run_dir), "--max-steps", str(STEPS), "--resume", "auto"]
    return subprocess.Popen(
        command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """Wait for the run's end; returns when its process had exited (the interpreter's
    exit after the teardown is the attempt's too) and its output."""
    assert proc.stdout is not None
    lines = list(proc.stdout)
    proc.wait(timeout=120)
    exited_by = time.time()
    output = "".join(lines)
    assert proc.returncode == 0 and any(x.startswith("done:") for x in lines), output
    return exited_by, output


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


def exit_recorded(run_dir: Path) -> dict:
    """The step mark once the exit watcher has extended it to the process's end."""
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            mark = json.loads((run_dir / "goodput.mark").read_bytes())
        except ValueError:
            mark = {}
        if mark.get("exited"):
            return mark
        time.sleep(0.05)
    pytest.fail("the goodput exit watcher did not record the process's end")


def resume_step(run_dir: Path) -> int:
    latest = ckpt.latest(run_dir / "checkpoints")
    assert latest is not None, "no complete checkpoint before the kill"
    return int(ckpt.checkpoint_step(latest) or 0)


def test_killed_twice_every_second_attributed_and_redone_steps_badput(tmp_path, capsys):
    run_dir = tmp_path / "run"
    began = time.time()
    kill_after(start(run_dir), 14)
    first_resume = resume_step(run_dir)
    exit_recorded(run_dir)
    kill_after(start(run_dir), 27)
    second_resume = resume_step(run_dir)
    exit_recorded(run_dir)
    ended, _ = finish(start(run_dir))
    exit_recorded(run_dir)

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


KILL_RECIPE = Path(__file__).with_name("recipe_goodput_kill.py")


def run_kill_recipe(run_dir: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The scalar kill recipe as ``baton run``; returns the process and when it ended."""
    command = [sys.executable, "-m", "baton.core.cli.command", "run", str(KILL_RECIPE)]
    command += ["--run-dir", str(run_dir), "--max-steps", "16", "--save-every", "5", *flags]
    env = {**cli_env(), "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    return proc, time.time()


def test_steps_after_the_last_line_survive_a_kill_and_count_redone_exactly(tmp_path):
    run_dir = tmp_path / "run"
    killed, killed_by = run_kill_recipe(run_dir, "--kill-at", "13")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # the watcher saw the kill about when this test did
    assert exit_recorded(run_dir)["t1"] == pytest.approx(killed_by, abs=2.0)
    assert resume_step(run_dir) == 10
    lines = (run_dir / "goodput.jsonl").read_text().splitlines()
    assert all(json.loads(line)["step"] == 0 for line in lines)  # no line after a step
    # the mark alone says how far the killed attempt went
    (attempt,) = summarise(read_ledger(run_dir)).attempts
    assert attempt.last_step == 13 and attempt.steps == {"new": 13, "redone": 0}

    began_resume = time.time()
    resumed, ended = run_kill_recipe(run_dir, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    exit_recorded(run_dir)
    summary = summarise(read_ledger(run_dir))
    first, second = summary.attempts
    assert first.steps == {"new": 13, "redone": 0}  # appended from the mark by the resume
    assert second.steps == {"new": 16 - 13, "redone": 13 - 10}
    assert summary.steps == {"new": 16, "redone": 3}
    # the ledger tiles its span, to the rounding of epoch timestamps (2.4e-7 s each)
    assert sum(summary.seconds.values()) == pytest.approx(summary.wall_s, rel=1e-6, abs=1e-5)
    # the interpreter's exit after the teardown line is the attempt's (shutdown), and the
    # killed attempt's span ends at the kill
    teardown_line = json.loads((run_dir / "goodput.jsonl").read_text().splitlines()[-1])
    assert teardown_line["attempt"] == second.attempt
    assert teardown_line["t1"] < second.t1 and second.t1 == pytest.approx(ended, abs=2.0)
    assert second.t0 >= began_resume - 1
    assert first.t1 == pytest.approx(killed_by, abs=2.0) and first.seconds["shutdown"] > 0
