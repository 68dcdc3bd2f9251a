"""Stop conditions and control requests."""

from __future__ import annotations

import json

import pytest

from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt
from support.scalar_backend import ScalarBackend


class StopAt(Callback):
    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, driver, output):
        if driver.step == self.k:
            driver.control.request_stop(f"asked to stop at {self.k}")


class SaveAt(Callback):
    def __init__(self, k: int) -> None:
        self.k = k
        self.saved = []

    def on_step_end(self, driver, output):
        if driver.step == self.k:
            driver.control.request_save("forced save")

    def on_checkpoint_saved(self, driver, path):
        self.saved.append(path)


def test_callback_stops_training_at_step_k_with_reason(tmp_path):
    result = Driver(ScalarBackend(), [StopAt(4)], max_steps=100, run_dir=tmp_path).fit()
    assert result.step == 4
    assert result.stop_reason == "asked to stop at 4"


def test_force_save_writes_complete_checkpoint_with_reason(tmp_path):
    saver = SaveAt(3)
    driver = Driver(ScalarBackend(), [saver], max_steps=5, run_dir=tmp_path)
    result = driver.fit()
    path = tmp_path / "checkpoints" / "step_000003"
    assert saver.saved == [path] and result.checkpoints == [path]
    meta = json.loads((path / "baton.json").read_text())
    assert meta["reason"] == "forced save" and meta["step"] == 3 and meta["tokens"] == 24
    assert (tmp_path / "checkpoints" / "latest").resolve() == path
    state = path / "backend" / "state.json"
    assert meta["files"] == {
        "state.json": {"size": state.stat().st_size, "xxh3_128": ckpt.file_digest(state)}
    }


@pytest.mark.parametrize(
    ("limit", "expected_step"), [({"max_steps": 7}, 7), ({"max_tokens": 20}, 3)]
)
def test_step_and_token_limits(tmp_path, limit, expected_step):
    result = Driver(
        ScalarBackend(),
        max_steps=limit.get("max_steps", 1000),
        max_tokens=limit.get("max_tokens"),
        run_dir=tmp_path,
    ).fit()
    assert result.step == expected_step
    assert next(iter(limit)) in result.stop_reason


def test_time_limit(tmp_path):
    result = Driver(ScalarBackend(), max_time_s=0.05, run_dir=tmp_path).fit()
    assert "max_time_s" in result.stop_reason and result.train_time_s >= 0.05


def test_metrics_materialised_only_on_log_steps(tmp_path):
    class Lazy:
        """A lazy value that records every conversion to a host float."""

        reads = 0

        def __init__(self, v):
            self.v = v

        def item(self):
            Lazy.reads += 1
            return self.v

    class LazyBackend(ScalarBackend):
        def train_step(self, step):
            out = super().train_step(step)
            out.loss = Lazy(out.loss)
            return out

    seen = []

    class Grab(Callback):
        def on_log(self, driver, metrics):
            seen.append((driver.step, metrics["loss"]))

    Driver(LazyBackend(), [Grab()], max_steps=20, log_every=5, run_dir=tmp_path).fit()
    assert [s for s, _ in seen] == [5, 10, 15, 20]
    assert Lazy.reads == 4


def test_at_least_one_limit_required(tmp_path):
    with pytest.raises(ValueError, match="max_steps"):
        Driver(ScalarBackend(), run_dir=tmp_path)


def test_flags_are_read_and_cleared_through_their_reasons() -> None:
    """A step nobody asked anything of is idle; a request sets its flag with its reason,
    acting on it clears both, and a save veto alone keeps the step from being idle."""
    from baton.core.control import Control

    ctl = Control()
    assert ctl.idle and not (ctl.stop or ctl.save or ctl.eval or ctl.log)
    ctl.request_stop("limit", all_ranks=True)
    ctl.request_save("cadence")
    assert not ctl.idle and ctl.stop and ctl.save and ctl.reason("stop") == "limit"
    assert ctl.acting(ranks=2, agree=None) == {"stop"}  # only what every rank raised
    assert ctl.acting(ranks=1, agree=None) == {"stop", "save"}
    ctl.clear({"stop", "save"})
    assert ctl.idle and ctl.reason("save") == ""
    ctl.veto_save("loss is NaN")
    assert not ctl.idle and not ctl.save
    ctl.clear(set())
    assert ctl.idle
