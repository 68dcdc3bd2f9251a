"""LossGuard on a real loss spike (stop and rollback), abilities checked at setup, loud
unknown monitor keys, and the README's custom-callback example with evaluation on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from baton.callbacks import Checkpoint, EarlyStopping, LossGuard
from baton.core import Callback, Driver, MissingAbilityError
from baton.core.checkpoints import files as ckpt
from support.docs_examples import docs_example
from support.scalar_backend import ScalarBackend

from .conftest import tiny_driver

README = Path(__file__).parents[2] / "README.md"


class LrSpike(Callback):
    """Step ``at`` runs with a huge learning rate (once): the next losses jump, as after
    a bad batch. The backend's own scheduler sets the normal rate again after the step."""

    def __init__(self, at: int, lr: float = 3.0) -> None:
        self.at, self.lr, self.done = at, lr, False

    def on_step_start(self, driver: Driver) -> None:
        if driver.step + 1 == self.at and not self.done:
            self.done = True
            for group in driver.backend.optimizer.param_groups:  # type: ignore[attr-defined]
                group["lr"] = self.lr


class Losses(Callback):
    priority = 400

    def __init__(self) -> None:
        self.by_step: list[tuple[int, float]] = []

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.by_step.append((driver.step, metrics["loss"]))


def spiking_run(tmp_path: Path, action: str, max_steps: int):
    guard, losses = LossGuard(action=action, spike_factor=3.0, warmup_logs=2), Losses()  # type: ignore[arg-type]
    callbacks = [Checkpoint(every_n_steps=4, keep_last=None), guard, LrSpike(at=9), losses]
    driver = tiny_driver(tmp_path, callbacks, max_steps=max_steps, log_every=2)
    return driver, guard, losses


def test_loss_spike_stops_at_the_first_log_after_it(tmp_path: Path) -> None:
    driver, _, losses = spiking_run(tmp_path, "stop", max_steps=30)
    result = driver.fit()
    assert result.step == 10 and "loss spike" in result.stop_reason, losses.by_step
    assert "step_000008" in result.stop_reason  # names the last good checkpoint
    # the broken state was not saved, not even on stop
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")]
    assert names == ["step_000004", "step_000008"]


def test_loss_spike_rolls_back_and_skips_the_window(tmp_path: Path) -> None:
    driver, guard, losses = spiking_run(tmp_path, "rollback", max_steps=16)
    result = driver.fit()
    assert result.step == 16 and guard.rollbacks == 1
    logged = dict(losses.by_step)  # the later value of a step logged twice
    spiked = next(loss for step, loss in losses.by_step if step == 10)
    assert logged[10] < spiked / 3  # step 10 again, after the rollback: no spike
    stream = driver.backend.stream  # the 2 bad steps' batches were skipped
    assert (stream.epoch, stream.batches) == (0, 16 + 2)
    root = tmp_path / "checkpoints"
    names = [p.name for p in ckpt.list_checkpoints(root)]
    assert names == ["step_000004", "step_000008", "step_000012", "step_000016"]
    assert ckpt.read_meta(root / "step_000016")["callbacks"]["loss_guard"]["rollbacks"] == 1


def test_rollback_needs_skip_data_and_fails_before_training(tmp_path: Path) -> None:
    backend = ScalarBackend()  # no skip_data
    driver = Driver(backend, [LossGuard(action="rollback")], max_steps=5, run_dir=tmp_path)
    with pytest.raises(MissingAbilityError) as error:
        driver.fit()
    assert "LossGuard(action='rollback') needs 'skip_data'" in str(error.value)
    assert driver.step == 0 and backend.events == ["setup", "teardown"]
    # stopping needs nothing optional
    Driver(ScalarBackend(), [LossGuard(action="stop")], max_steps=3, run_dir=tmp_path).fit()


@pytest.mark.parametrize(
    ("callback", "phase_keys"),
    [
        (
            EarlyStopping("eval/los", patience=2),
            "evaluation metrics of step 2; they are: eval/loss",
        ),
        (Checkpoint(keep_best=1, monitor="eval_loss"), "training metrics of step 1; they are: "),
    ],
)
def test_unknown_monitor_keys_fail_at_the_first_metrics_naming_those_that_exist(
    tmp_path: Path, callback: Callback, phase_keys: str
) -> None:
    driver = Driver(
        ScalarBackend(), [callback], max_steps=9, log_every=1, eval_every=2, run_dir=tmp_path
    )
    with pytest.raises(ValueError, match=re.escape(phase_keys)) as error:
        driver.fit()
    assert "loss" in str(error.value)


def readme_example() -> str:
    return docs_example("custom-callback")


class EvalSeen(Callback):
    def __init__(self) -> None:
        self.evals: list[float] = []

    def on_eval_end(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.evals.append(metrics["eval/loss"])


def test_readme_custom_callback_example_runs_with_evaluation_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe_file = tmp_path / "early_stop.py"
    recipe_file.write_text(readme_example())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("early_stop")
    try:
        driver = module.recipe(threshold=4.0, max_steps=60)
    finally:
        sys.modules.pop("early_stop", None)
    seen = EvalSeen()
    driver.options = driver.options.replace(eval_every=5)
    driver.callbacks.append(seen)
    result = driver.fit()
    assert result.stop_reason.startswith("loss ") and "< 4.0" in result.stop_reason
    assert result.step < 60 and seen.evals  # evaluation ran and did not break the callback


class CountedLoss(float):
    """A host float that counts the arithmetic done on it (what would be device work)."""

    ops = 0

    def __sub__(self, other: float) -> CountedLoss:
        CountedLoss.ops += 1
        return CountedLoss(float(self) - float(other))

    def __add__(self, other: float) -> CountedLoss:
        CountedLoss.ops += 1
        return CountedLoss(float(self) + float(other))


class CountingBackend(ScalarBackend):
    def train_step(self, step: int):
        output = super().train_step(step)
        output.loss = CountedLoss(output.loss)
        return output


class OpsPerStep(Callback):
    priority = 400

    def __init__(self) -> None:
        self.steps_with_ops: list[int] = []
        self._seen = 0

    def on_step_end(self, driver: Driver, output) -> None:
        if CountedLoss.ops != self._seen:
            self.steps_with_ops.append(driver.step)
            self._seen = CountedLoss.ops


def test_loss_guard_does_no_arithmetic_on_the_lazy_loss(tmp_path: Path) -> None:
    CountedLoss.ops = 0
    ops = OpsPerStep()
    guard = LossGuard()
    driver = Driver(CountingBackend(), [guard, ops], max_steps=25, log_every=10, run_dir=tmp_path)
    driver.fit()
    assert CountedLoss.ops == 0 and ops.steps_with_ops == []  # it reads the fetched loss
    assert guard.logs_seen == 3  # judged at log steps 10, 20 and 25 (the last)
