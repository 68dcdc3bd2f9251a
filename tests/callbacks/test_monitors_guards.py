"""Monitors, guards, early stopping, GC control, profiler and time limit on Fabric (CPU)."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from baton.callbacks import (
    Checkpoint,
    EarlyStopping,
    GarbageCollection,
    LossGuard,
    MemoryMonitor,
    OptimizerMonitor,
    Profiler,
    ThroughputMonitor,
    TimeLimit,
)
from baton.callbacks.device_flops import peak_flops
from baton.core import Callback
from baton.core.checkpoints import files as ckpt

from .conftest import tiny_driver


class Collect(Callback):
    priority = 400

    def __init__(self) -> None:
        self.logs: list[dict[str, float]] = []

    def on_log(self, driver, metrics):
        self.logs.append({"step": driver.step, **metrics})


class PoisonWeights(Callback):
    """Make the loss NaN from step ``at`` on (once), as a bad batch would."""

    def __init__(self, at: int) -> None:
        self.at, self.done = at, False

    def on_step_start(self, driver):
        if driver.step + 1 == self.at and not self.done:
            import torch

            self.done = True
            with torch.no_grad():
                next(driver.backend.model.parameters()).fill_(float("nan"))


def test_monitor_keys(tmp_path: Path) -> None:
    seen = Collect()
    cbs = [ThroughputMonitor(), MemoryMonitor(), OptimizerMonitor(), GarbageCollection(5), seen]
    was_enabled = gc.isenabled()
    tiny_driver(tmp_path, cbs, max_steps=10).fit()
    assert gc.isenabled() == was_enabled and cbs[3].collections == 2
    last = seen.logs[-1]
    assert last["throughput/tokens_per_s"] > 0 and last["throughput/step_time_s"] > 0
    assert last["throughput/tflops_per_device"] > 0 and "throughput/mfu" not in last  # CPU
    assert 0.05 < last["memory/host_rss_gib"] < 64
    assert last["optim/lr"] == last["lr"] and last["optim/grad_norm"] > 0
    assert last["gc/collect_s"] >= 0
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("cpu") is None
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp8") == 1979e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "32-true") == 67e12
    assert peak_flops("TPU v5 lite", "bf16-mixed") == 197e12 and peak_flops("TPU v5p") == 459e12
    assert peak_flops("TPU v6 lite") == 918e12 and peak_flops("TPU v4") == 275e12
    with pytest.raises(ValueError, match="unknown precision 'bf17'"):
        peak_flops("TPU v4", "bf17")


def test_nan_stops_and_never_saves_the_broken_state(tmp_path: Path) -> None:
    guard = LossGuard(action="stop")
    driver = tiny_driver(
        tmp_path, [Checkpoint(every_n_steps=4), guard, PoisonWeights(7)], max_steps=20
    )
    driver.backend.config.grad_clip = None  # Fabric's clipping raises on NaN grads itself
    result = driver.fit()
    # detected at the step-8 checkpoint (checked before saving), not at log step 10
    assert result.step == 8 and "non-finite" in result.stop_reason
    assert "step_000004" in result.stop_reason  # names the last good checkpoint
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["step_000004"]


def test_nan_rolls_back_and_skips_the_window(tmp_path: Path) -> None:
    guard, seen = LossGuard(action="rollback"), Collect()
    driver = tiny_driver(
        tmp_path, [Checkpoint(every_n_steps=4), guard, PoisonWeights(7), seen], max_steps=16
    )
    driver.backend.config.grad_clip = None
    result = driver.fit()
    assert result.step == 16 and guard.rollbacks == 1
    losses = [m["loss"] for m in seen.logs if "loss" in m]
    assert all(loss == loss for loss in losses[-2:])  # finite after the rollback
    assert driver.backend.stream.batches == 16 + 4  # 4 bad steps' data skipped
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000016")
    assert meta["callbacks"]["loss_guard"]["rollbacks"] == 1


def test_early_stopping_patience_survives_resume(tmp_path: Path) -> None:
    stop = EarlyStopping("score", patience=3)

    class Score(Callback):
        def on_log(self, driver, metrics):
            metrics["score"] = 1.0  # never improves after the first

    driver = tiny_driver(tmp_path, [Checkpoint(every_n_steps=5), Score(), stop], max_steps=10)
    driver.fit()
    assert stop.wait == 1
    stop2 = EarlyStopping("score", patience=3)
    driver = tiny_driver(
        tmp_path, [Checkpoint(every_n_steps=5), Score(), stop2], max_steps=40, resume="auto"
    )
    result = driver.fit()
    assert result.step == 20 and "early stopping" in result.stop_reason  # checks at 15, 20


def test_profiler_writes_a_trace(tmp_path: Path) -> None:
    prof = Profiler(start_step=3, num_steps=2)
    tiny_driver(tmp_path, [prof], max_steps=6).fit()
    assert prof.library == "torch"
    trace = json.loads(prof.trace_path.read_text())
    assert trace["traceEvents"]


def test_time_limit_stops_with_a_checkpoint(tmp_path: Path, caplog) -> None:
    limit = TimeLimit(minutes=1e-9)
    caplog.set_level(logging.INFO, logger="baton")
    result = tiny_driver(tmp_path, [Checkpoint(), limit], max_steps=50).fit()
    assert result.step == 1 and "time limit" in result.stop_reason
    assert ckpt.latest(tmp_path / "checkpoints").name == "step_000001"


def test_no_torch_or_jax_at_import() -> None:
    code = (
        "import sys, baton.callbacks, baton.callbacks.sinks.jsonl;"
        "from baton.core.registry import CALLBACKS; CALLBACKS.names();"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bad", [{"action": "explode"}, {"spike_factor": 0.5}])
def test_guard_rejects_bad_options(bad) -> None:
    with pytest.raises(ValueError):
        LossGuard(**bad)
