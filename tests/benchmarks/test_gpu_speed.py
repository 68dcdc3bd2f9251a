"""``benchmarks/gpu_speed.py --tiny`` on CPU: the GPU script's rows run their real code
paths at a tiny size (Fabric SFT, the hand loop, TRL matched, Fabric DPO, Megatron-Core
and its bare loop, the levers against the plain path where the recipe has them), each
prints its line, and the result files hold finite figures.
No time is asserted; MFU is unknown on a CPU. The MFU formula, the device peaks and
the targets are checked on their own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_speed_inputs import REAL
from benchmarks.gpu_speed_measure import (
    Result,
    peak_tflops,
    recorded_paths,
    training_flops_per_token,
)
from benchmarks.gpu_speed_report import TARGETS, target_lines

ROOT = Path(__file__).resolve().parents[2]
ROWS = ["hand-loop", "trl-sft-matched", "fabric-sft-1x4", "fabric-dpo", "megatron-bare", "megatron"]
#: levers against the plain path: skipped while the recipe has no lever settings
PARITY = "fabric-sft-parity"


@pytest.mark.slow
def test_tiny_run_prints_a_line_per_row_and_writes_finite_results(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("megatron.core")
    only = [flag for name in [*ROWS, PARITY] for flag in ("--only", name)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_speed.py"), "--tiny", *only,
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for name in ROWS:
        assert name in lines, proc.stdout
        seconds = float(lines[name].split()[1])
        assert math.isfinite(seconds) and seconds > 0, lines[name]
        assert "MFU n/a" in lines[name] and "error" not in lines[name]
    assert (
        "x hand-loop" in lines["fabric-sft-1x4"] and "x trl-sft-matched" in lines["fabric-sft-1x4"]
    )
    assert "x megatron-bare" in lines["megatron"]
    assert "paths layers=local" in lines["megatron"]  # no GPU: Megatron's local layers
    parity = lines[PARITY]
    assert "skipped: hf_finetune.py has none of the lever settings" in parity or (
        "loss rel" in parity and "grad_norm rel" in parity
    ), parity

    results = json.loads((tmp_path / "gpu_speed.json").read_text())
    rows = {row["name"]: row for row in results["rows"]}
    assert list(rows) == [*ROWS[:4], PARITY, *ROWS[4:]]  # in the script's order
    checked = rows.pop(PARITY)
    assert checked["error"] is None
    if checked["parity"] is not None:  # on a CPU every lever falls back to the plain path
        assert checked["parity"]["loss"] <= 1e-2 and checked["parity"]["grad_norm"] <= 5e-2
    for row in rows.values():
        assert row["error"] is None and row["mfu"] is None
        assert math.isfinite(row["seconds_per_step"]) and row["seconds_per_step"] > 0
        assert all(math.isfinite(r) and r > 0 for r in row["ratios"].values())
    assert set(rows["fabric-dpo"]["ratios"]) == set()  # its TRL baselines did not run
    assert results["environment"]["shape"]["seq_len"] == 128
    assert len(results["targets"]) == len(TARGETS)
    table = (tmp_path / "gpu_speed.md").read_text()
    assert table.count("\n| ") >= len(ROWS) + 1 + len(TARGETS)


def test_mfu_counts_six_flops_a_parameter_and_causal_attention() -> None:
    """The figures the MFU stands on: Qwen3-0.6B's 596 M parameters at 4,096 tokens give
    the FLOPs per token that make 0.611 s/step 13.5% of 989 TFLOP/s."""
    flops = training_flops_per_token(REAL.qwen3, 596_049_920, REAL.seq_len)
    assert flops == 6 * 596_049_920 + 6 * 28 * 4096 * 16 * 128
    mfu = 4 * 4096 * flops / 0.611 / 989e12
    assert mfu == pytest.approx(0.135, abs=0.001)


def test_device_peaks_and_override() -> None:
    assert peak_tflops("NVIDIA H200", None) == 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", None) == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", None) == 756.0
    assert peak_tflops("NVIDIA H200", 700.0) == 700.0
    assert peak_tflops("Some GPU", None) is None


def test_recorded_paths_read_from_settings() -> None:
    assert recorded_paths({"lr_schedule": "constant"}) == "n/a"
    recorded = {"attention": "flex", "cross_entropy": "chunked"}
    # the recipe's own --cross-entropy choice (auto) is not the path it took
    assert recorded_paths({"fast_paths": recorded, "cross_entropy": "auto"}) == (
        "attention=flex cross_entropy=chunked"
    )


def test_targets_judge_the_measured_rows() -> None:
    def sft(name: str, seconds: float, mfu: float, **ratios: float) -> Result:
        return Result(name, name, seconds_per_step=seconds, mfu=mfu, ratios=ratios)

    results = {
        "fabric-sft-1x4": sft("fabric-sft-1x4", 0.24, 0.36, **{"trl-sft-defaults": 0.2,
                                                                "trl-sft-matched": 0.5}),
        "fabric-sft-4x1": sft("fabric-sft-4x1", 0.25, 0.345, **{"trl-sft-defaults": 0.21,
                                                                 "trl-sft-matched": 0.52}),
    }  # fmt: skip
    verdicts = {text: passed for text, _, passed in target_lines(results)}
    assert verdicts == {
        "Fabric SFT >= 35% MFU": False,  # 4x1 is at 34.5%
        "Fabric SFT <= 0.5x TRL SFTTrainer defaults": True,
        "Fabric SFT <= 0.8x TRL SFTTrainer matched": True,
        "Fabric DPO <= 0.5x TRL DPOTrainer defaults": None,  # not run
        "SFT MFU within 5% between 1x4 and 4x1": True,  # 4.2% apart
        "levers give the plain path's first loss (1e-2) and gradient norm (5e-2) in bf16": None,
    }
    results["fabric-sft-parity"] = Result("p", "p", parity={"loss": 2e-3, "grad_norm": 0.08})
    verdicts = {text: passed for text, _, passed in target_lines(results)}
    assert (
        verdicts["levers give the plain path's first loss (1e-2) and gradient norm (5e-2) in bf16"]
        is False
    )
