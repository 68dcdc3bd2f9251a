"""The watchdog: a rank that sleeps inside a step is named, both ranks' stacks are
written, and with ``action="abort"`` torchrun restarts the job, which resumes and ends
bitwise equal to an unhindered run (2 ranks, gloo, real processes). A single-rank run
with ``action="warn"`` reports a stall and a slow step and trains on."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from baton.callbacks import Watchdog
from baton.callbacks.watchdog import WATCHDOG_DIR
from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt
from support.processes import run_job
from support.scalar_backend import ScalarBackend
from support.states import assert_bitwise_equal, load_state
from support.torchrun import torchrun

WORKER = Path(__file__).with_name("watchdog_worker.py")


@pytest.mark.slow
def test_a_rank_asleep_in_a_step_is_named_dumped_and_the_restarted_job_matches(tmp_path):
    reference, hindered = tmp_path / "reference", tmp_path / "hindered"
    torchrun(WORKER, str(reference), timeout=300)
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    done = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "1", str(WORKER), str(hindered), "--sleep-rank", "1",
         "--sleep-at", "7"],
        {**os.environ, **env}, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert (hindered / "slept").exists()  # the sleep happened, and did not outlast the job

    watchdog = hindered / WATCHDOG_DIR
    incidents = [json.loads(p.read_text()) for p in sorted(watchdog.glob("incident-*.json"))]
    stalls = [i for i in incidents if i["kind"] == "stalled"]
    assert stalls, output[-4000:]  # whichever rank saw it first aborted the job
    for incident in stalls:
        assert incident["step"] in (7, 8) and incident["behind"] == [1], incident
        assert incident["idle_s"] >= 10  # no earlier than the configured timeout
    assert "furthest behind: rank(s) 1" in output
    # the first rank to see the stall waits (grace_s) for every rank's stacks, then
    # aborts; a later reporter may find its peer already gone
    complete = [i for i in stalls if all(Path(path).exists() for path in i["stacks"])]
    assert complete, stalls
    for incident in complete:  # every rank's stacks of the incident, taken during the sleep
        asleep, awake = (Path(path).read_text() for path in incident["stacks"][::-1])
        assert "in hang_here" in asleep and "in on_step_end" in asleep, asleep
        assert "in hang_here" not in awake and "in fit" in awake, awake

    final = ckpt.checkpoint_name(12)
    assert_bitwise_equal(
        load_state(reference / "checkpoints" / final), load_state(hindered / "checkpoints" / final)
    )


class Pause(Callback):
    """Sleep ``seconds`` inside step ``at`` (in ``on_step_end``, before the watchdog)."""

    def __init__(self, at: int, seconds: float) -> None:
        self.at, self.seconds = at, seconds

    def on_step_end(self, driver: Driver, output: Any) -> None:
        if driver.step == self.at:
            time.sleep(self.seconds)


def test_warn_reports_a_stall_and_a_slow_step_and_training_goes_on(tmp_path):
    watchdog = Watchdog(timeout_s=0.6, slow_factor=3, min_slow_s=0.3, poll_s=0.1, window=8)
    steps = [Pause(30, 0.4), Pause(60, 1.5)]

    class Ticks(Callback):  # steps of a few ms, so the median is known and small
        def on_step_end(self, driver: Driver, output: Any) -> None:
            time.sleep(0.002)

    driver = Driver(ScalarBackend(), [*steps, Ticks(), watchdog], max_steps=70, run_dir=tmp_path)
    result = driver.fit()
    assert result.step == 70
    kinds = {(i["kind"], i["step"]) for i in watchdog.incidents}
    assert ("slow", 30) in kinds and ("stalled", 60) in kinds, watchdog.incidents
    assert ("stalled", 30) not in kinds  # 0.4 s is slow, not a stall
    assert all(i["behind"] == [0] for i in watchdog.incidents)
    dumps = list((tmp_path / WATCHDOG_DIR).glob("stacks-step60-*-rank0.txt"))  # slow, stalled
    assert dumps
    for dump in dumps:
        stacks = dump.read_text()
        assert "in on_step_end" in stacks and "test_watchdog.py" in stacks, stacks
    assert watchdog._thread is None  # the monitor stopped with the run


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slow_factor must be > 1"):
        Watchdog(slow_factor=0.5)
    with pytest.raises(ValueError, match="action must be"):
        Watchdog(action="explode")  # pyright: ignore[reportArgumentType]
