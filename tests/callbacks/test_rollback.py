"""``LastGood``: the newest checkpoint at or before the last healthy step, the save
refused, and the rollback done once at the next step's start."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.callbacks.rollback import LastGood
from baton.core import Callback, Driver
from baton.core.checkpoints.files import checkpoints_dir
from baton.core.control import Control
from support.scalar_backend import ScalarBackend


class SaveEvery(Callback):
    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, driver, output):
        if driver.step % self.every == 0:
            driver.control.request_save("schedule", all_ranks=True)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A run's checkpoints at steps 3, 6 and 9."""
    Driver(ScalarBackend(), [SaveEvery(3)], max_steps=9, run_dir=tmp_path).fit()
    return checkpoints_dir(tmp_path)


def test_the_newest_checkpoint_at_or_before_the_last_healthy_step(saved):
    last_good = LastGood()
    assert last_good.checkpoint(saved) is None  # step 0: nothing saved that early
    last_good.mark(8)
    found = last_good.checkpoint(saved)
    assert found is not None and found[0].name == "step_000006" and found[1]["step"] == 6
    last_good.mark(9)
    found = last_good.checkpoint(saved)
    assert found is not None and found[1]["step"] == 9


def test_the_save_is_refused_and_the_rollback_happens_once_at_the_next_start(saved):
    last_good = LastGood()
    last_good.mark(7)
    control = Control()
    control.request_save("schedule")
    good = last_good.refuse_save(control, "NaN loss", saved)
    assert good is not None and good[0].name == "step_000006"
    assert control.save_vetoed == "NaN loss" and not control.save
    gone_back: list[Path] = []
    assert last_good.roll_back_if_due(saved, gone_back.append) is None  # none planned
    last_good.roll_back_at_next_step(8)
    assert last_good.roll_back_if_due(saved, gone_back.append) == 8
    assert [p.name for p in gone_back] == ["step_000006"]
    assert last_good.roll_back_if_due(saved, gone_back.append) is None  # done once
