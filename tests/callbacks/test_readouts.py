"""Readouts that tell the truth: the progress bar moves every step without reading device
values, and throughput counts training time only (not evaluation or blocking saves)."""

from __future__ import annotations

import io
import time
from pathlib import Path

from rich.console import Console

from baton.callbacks import Progress, ThroughputMonitor
from baton.core import Callback, Driver
from support.scalar_backend import ScalarBackend


class Recorder(Callback):
    """Runs after every other callback and keeps what it saw."""

    priority = 10_000

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress
        self.completed: list[float] = []
        self.logs: list[dict[str, float]] = []

    def on_step_end(self, driver: Driver, output: object) -> None:
        if self.progress is not None and self.progress._bar is not None:
            self.completed.append(self.progress._bar.tasks[0].completed)

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.logs.append(dict(metrics))


class SlowEvaluation(Callback):
    def on_eval_start(self, driver: Driver) -> None:
        time.sleep(0.3)


def test_progress_moves_every_step_between_log_steps(tmp_path: Path) -> None:
    progress = Progress(console=Console(file=io.StringIO(), force_terminal=False))
    seen = Recorder(progress)
    Driver(ScalarBackend(), [progress, seen], max_steps=6, log_every=100, run_dir=tmp_path).fit()
    assert seen.completed == [1, 2, 3, 4, 5, 6]


def test_throughput_leaves_evaluation_time_out(tmp_path: Path) -> None:
    seen = Recorder()
    Driver(
        ScalarBackend(),
        [ThroughputMonitor(), SlowEvaluation(), seen],
        max_steps=4,
        log_every=4,
        eval_every=2,
        run_dir=tmp_path,
    ).fit()
    step_time = seen.logs[-1]["throughput/step_time_s"]
    # two evaluations of 0.3 s fell into the window of four microsecond steps
    assert step_time < 0.05, step_time


class SampleBackend(ScalarBackend):
    """A model that is not a token model: its steps count samples, no tokens."""

    def train_step(self, step: int):  # type: ignore[override]
        output = super().train_step(step)
        output.tokens = 0
        return output


def test_a_model_without_tokens_reports_samples_per_second(tmp_path: Path) -> None:
    from baton.callbacks import CompositeLogger
    from baton.callbacks.sinks.console import ConsoleSink
    from baton.callbacks.standard import CONSOLE_KEYS

    console = io.StringIO()
    progress = Progress(console=Console(file=console, width=200, force_terminal=False))
    recorder = Recorder()
    line = io.StringIO()
    logger = CompositeLogger([ConsoleSink(CONSOLE_KEYS, stream=line)])
    callbacks = [ThroughputMonitor(), progress, logger, recorder]
    Driver(SampleBackend(), callbacks, max_steps=20, log_every=10, run_dir=tmp_path).fit()
    last = recorder.logs[-1]
    assert last["throughput/samples_per_s"] > 0
    assert "throughput/tokens_per_s" not in last and "throughput/tflops_per_device" not in last
    assert "throughput/samples_per_s" in line.getvalue()
    assert "tokens_per_s" not in line.getvalue()
    assert "samples/s" in console.getvalue() and "tok/s" not in console.getvalue()

    tokens = io.StringIO()  # a token model shows tokens/s, and only that rate
    logger = CompositeLogger([ConsoleSink(CONSOLE_KEYS, stream=tokens)])
    Driver(
        ScalarBackend(), [ThroughputMonitor(), logger], max_steps=10, run_dir=tmp_path / "t"
    ).fit()
    assert "throughput/tokens_per_s" in tokens.getvalue()
    assert "samples_per_s" not in tokens.getvalue()


def test_evaluating_a_checkpoint_shows_no_progress_bar(tmp_path: Path) -> None:
    driver = Driver(ScalarBackend(), max_steps=3, run_dir=tmp_path / "run", save_on_stop=True)
    driver.fit()
    screen = io.StringIO()
    progress = Progress(console=Console(file=screen, width=200, force_terminal=False))
    evaluation = Driver(ScalarBackend(), [progress], max_steps=300, run_dir=tmp_path / "eval")
    metrics = evaluation.evaluate_checkpoint(driver.saved[-1])
    assert "eval/loss" in metrics
    assert screen.getvalue() == ""  # no "step 3/300" bar
