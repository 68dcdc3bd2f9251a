"""Under torchrun, a clean baton error that every rank stops on is printed once, by the
first rank that has it; each rank keeps its exit status (2), and torchrun's failure
report names the message as the root cause (its error file) instead of a link.

A real ``torchrun`` of two gloo ranks runs a recipe whose ranks meet at a barrier and
then both refuse their setting; torchrun's monitor interval is long enough that neither
rank is stopped before it reports."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from support.processes import run_job

MESSAGE = "--widgets 0: a run needs at least one widget; pass --widgets 1 or more"
RECIPE = f'''
import torch.distributed as dist

from baton.core.errors import UsageError


def recipe(widgets: int = 0):
    """Refuses its flag on every rank, after the ranks have met."""
    dist.init_process_group("gloo")
    dist.barrier()
    raise UsageError("{MESSAGE}")
'''


def test_every_rank_stops_on_one_error_printed_once(tmp_path: Path) -> None:
    recipe = tmp_path / "refusing_recipe.py"
    recipe.write_text(textwrap.dedent(RECIPE))
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    done = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--monitor-interval", "3", "-m", "baton.core.cli.command", "run", str(recipe)],
        env, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output  # torchrun's own status when a worker fails
    printed = [line for line in done.stderr.splitlines() if line.startswith("baton: ")]
    assert printed == [f"baton: {MESSAGE}"], output
    report = done.stderr[done.stderr.rfind("Failures:") :]
    assert report.count("exitcode  : 2") == 2, report  # both ranks stopped on it, status 2
    root = report[report.find("Root Cause") :]
    assert f"traceback : baton: {MESSAGE}" in root, report
    assert "traceback : stopped on the same error as rank" in report, report
    assert report.count(MESSAGE) == 1, report
