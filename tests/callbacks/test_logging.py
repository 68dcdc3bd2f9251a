"""CompositeLogger sinks read back with their own readers; baton plot; a failing sink."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from baton.callbacks import CompositeLogger, OptimizerMonitor, ThroughputMonitor
from baton.callbacks.sinks.console import ConsoleSink
from baton.callbacks.sinks.jsonl import read_jsonl
from baton.callbacks.sinks.wandb import WandbSink
from baton.tools.plot import main as plot_main

from .conftest import tiny_driver, wandb_history


class BrokenSink:
    """A sink whose every write fails, as W&B does when unreachable."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def open(self, driver) -> None:
        pass

    def write(self, step, metrics, phase="train") -> None:
        self.calls += 1
        raise ConnectionError("api.wandb.ai unreachable")

    def close(self) -> None:
        pass


def test_all_sinks_hold_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    broken = BrokenSink()
    logger = CompositeLogger(
        ["jsonl", "tensorboard", WandbSink(project="baton-test"), ConsoleSink(["loss"]), broken]
    )
    caplog.set_level(logging.WARNING, logger="baton")
    driver = tiny_driver(
        tmp_path, [ThroughputMonitor(), OptimizerMonitor(), logger], max_steps=20, eval_every=10
    )
    result = driver.fit()
    assert result.step == 20  # the broken sink did not stop training
    assert broken.calls > 1 and caplog.text.count("log sink 'broken' failed") == 1

    # JSONL: one line per log step and per evaluation, each saying its phase;
    # evaluation keys never arrive with the training metrics
    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in lines if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20]
    assert all(
        k.startswith("eval/") for r in evals for k in r if k not in ("step", "phase", "time")
    )
    assert not any(k.startswith("eval/") for r in lines if r["phase"] == "train" for k in r)
    # read back merged by step
    records = read_jsonl(tmp_path / "logs" / "metrics.jsonl")
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    assert "eval/loss" in records[1] and records[-1]["optim/lr"] > 0
    assert records[-1]["throughput/tokens_per_s"] > 0

    # TensorBoard, read with tensorboard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [5, 10, 15, 20]
    assert loss[-1].value == pytest.approx(records[-1]["loss"], rel=1e-6)
    assert [e.step for e in acc.Scalars("eval/loss")] == [10, 20]

    # W&B offline run directory holds the history
    runs = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    rows = wandb_history(next(runs[0].glob("run-*.wandb")))
    steps = [int(r["_step"]) for r in rows if "loss" in r]
    losses = [float(r["loss"]) for r in rows if "loss" in r]
    assert steps == [5, 10, 15, 20]
    assert losses[-1] == pytest.approx(records[-1]["loss"], rel=1e-6)

    # console lines
    out = capsys.readouterr().out
    assert "step     20 | loss" in out

    # baton plot
    assert plot_main([str(tmp_path)]) == 0
    for chart in ("loss", "lr", "throughput"):
        png = tmp_path / "plots" / f"{chart}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_metrics_says_what_to_do(tmp_path: Path, capsys) -> None:
    assert plot_main([str(tmp_path)]) == 2
    assert "CompositeLogger" in capsys.readouterr().err


def test_failing_open_drops_the_sink(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class NoOpen(BrokenSink):
        name = "no_open"

        def open(self, driver) -> None:
            raise PermissionError("read-only file system")

    caplog.set_level(logging.WARNING, logger="baton")
    tiny_driver(tmp_path, [CompositeLogger([NoOpen(), "jsonl"])], max_steps=5).fit()
    assert "log sink 'no_open' failed to open" in caplog.text
    assert len(read_jsonl(tmp_path / "logs" / "metrics.jsonl")) == 1
