"""``benchmarks/run.py --quick`` runs every benchmark on tiny settings and prints the table.

One subprocess for all of them (torch and lightning import once); about a minute on 2
idle cores. No timing is asserted: only that each benchmark produced its rows.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_prints_every_benchmark(tmp_path) -> None:
    out = tmp_path / "quick.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BATON_BENCH_SCRATCH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    by_benchmark = {r["benchmark"] for r in rows}
    assert by_benchmark == {
        "dispatch",
        "host_syncs",
        "lightning",
        "checkpoint",
        "native",
        "prepare",
        "startup",
        "posttrain",
        "grpo",
    }
    assert not [r for r in rows if r["note"].startswith("error")]
    for row in rows:
        assert row["case"] in proc.stdout  # the printed table has every row

    cases = {(r["benchmark"], r["case"]): r for r in rows}
    dispatch = [r for r in rows if r["benchmark"] == "dispatch"]
    assert len(dispatch) == 11  # 7 counts, the stack with a torch and a JAX loss, 2 sinks
    # (a) and (b) did the same math: the ratio measures the driver
    assert cases[("lightning", "(a') hand-written Fabric loop")]["note"].startswith(
        "losses equal to (a) bit for bit"
    )
    (baton,) = [r for r in rows if r["case"].startswith("(b)") and r["baseline"] == "a"]
    assert baton["note"] == "losses equal to (a) bit for bit"
    assert cases[("host_syncs", "driver + Progress, non-log steps")]["passed"] is True
    assert cases[("checkpoint", "fabric: synchronous save blocks")]["value"] > 0
    fabric_native = cases[("native", "fabric: bare loop over train_step vs baton")]
    assert fabric_native["ratio"] is not None
    for case in (
        "packing: baton bfd",
        "sft step: baton fabric",
        "dpo step: baton fabric (precomputed)",
        "chat prepare, generation tags",
        "chat prepare, plain template",
    ):
        assert cases[("posttrain", case)]["ratio"] is not None
    assert cases[("startup", "baton data prepare, 0.5 MB JSON Lines")]["ratio"] is not None
    assert cases[("grpo", "grpo step: baton fabric")]["ratio"] is not None
    assert cases[("grpo", "split: fabric generation")]["value"] > 0
