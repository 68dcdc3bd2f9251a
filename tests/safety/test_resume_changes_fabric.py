"""Resuming the Fabric backend with an allowed change of learning rate or schedule
length trains as a run started with the new settings would: the restored optimizer and
scheduler state do not keep the checkpoint's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.checkpoints import files as ckpt

RECIPE = Path(__file__).with_name("recipe_gpt.py")


def fit(run_dir: Path, *args: str):  # -> Driver
    """``baton run tests/safety/recipe_gpt.py`` in this process; the driver after fit."""
    import torch

    from baton.core.cli.recipe import build_driver

    torch.set_num_threads(1)
    driver = build_driver(RECIPE, ["--run-dir", str(run_dir), *args])
    driver.fit()
    return driver


def logged_lr(run_dir: Path) -> dict[int, float]:
    rows = read_jsonl(run_dir / "logs" / "metrics.jsonl")
    return {row["step"]: row["lr"] for row in rows if "lr" in row}


def lose_last_checkpoint(run_dir: Path) -> None:
    """As a run killed after step 12 but before its checkpoint was saved: resume from 6."""
    root = run_dir / "checkpoints"
    ckpt.remove_checkpoint(root / "step_000012")
    ckpt.update_latest(root, root / "step_000006")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """The learning rate of each step of an uninterrupted 12-step run at lr 2e-3."""
    run_dir = tmp_path_factory.mktemp("reference")
    fit(run_dir, "--max-steps", "12", "--lr", "2e-3")
    return logged_lr(run_dir)


def test_a_changed_lr_is_trained_at(tmp_path: Path, reference: dict[int, float]) -> None:
    fit(tmp_path, "--max-steps", "12", "--lr", "1e-3")
    lose_last_checkpoint(tmp_path)
    driver = fit(
        tmp_path, "--max-steps", "12", "--lr", "2e-3", "--resume", "auto", "--allow-changed", "lr"
    )
    lr = logged_lr(tmp_path)
    assert lr[6] == pytest.approx(reference[6] / 2)  # before the resume: the old rate
    for step in range(7, 13):  # after it: the new one, on the same schedule
        assert lr[step] == pytest.approx(reference[step], rel=1e-6), step
    assert driver.backend.scheduler.base_lrs == pytest.approx([2e-3, 2e-3])
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000012")
    assert meta["resume_changes"] == [
        {"step": 6, "changes": {"lr": {"checkpoint": 1e-3, "now": 2e-3, "applied_by": "backend"}}}
    ]


def test_a_longer_max_steps_rebuilds_the_schedule(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    fit(tmp_path, "--max-steps", "6", "--lr", "2e-3")
    assert logged_lr(tmp_path)[6] < reference[6]  # the 6-step cosine had nearly ended
    driver = fit(tmp_path, "--max-steps", "12", "--resume", "auto", "--allow-changed", "max_steps")
    lr = logged_lr(tmp_path)
    for step in range(7, 13):  # the 12-step cosine, continued from step 6
        assert lr[step] == pytest.approx(reference[step], rel=1e-6), step
    # after the last step the schedule has reached its floor: a tenth of the peak
    assert driver.backend.optimizer.param_groups[0]["lr"] == pytest.approx(2e-4)
    assert lr[7] > 2 * 2e-4  # mid-curve when resumed, not left at the old schedule's end
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000012")
    (change,) = meta["resume_changes"]
    assert change["changes"]["max_steps"]["applied_by"] == "backend and driver"


def test_lightning_schedules_are_rebuilt_for_a_changed_lr(tmp_path: Path) -> None:
    """A LightningModule's step and epoch schedules (``configure_optimizers``) continue
    from the restored step at the new rate, as in a run started at that rate."""
    from baton.core.cli.recipe import build_driver

    recipe = Path(__file__).parents[2] / "recipes" / "lightning_module.py"

    def fit_lightning(run_dir: Path, *args: str):  # -> Driver
        flags = ["--run-dir", str(run_dir), "--eval-every", "10", "--log-every", "1"]
        driver = build_driver(recipe, [*flags, *args])
        driver.fit()
        return driver

    full = fit_lightning(tmp_path / "full", "--max-steps", "20", "--lr", "2e-2")
    fit_lightning(tmp_path / "run", "--max-steps", "10", "--lr", "1e-2")
    resumed = fit_lightning(
        tmp_path / "run",
        *("--max-steps", "20", "--lr", "2e-2", "--resume", "auto"),
        *("--allow-changed", "lr,max_steps"),
    )
    lr = resumed.backend.optimizer.param_groups[0]["lr"]  # half of it with the restored rate
    assert lr == pytest.approx(full.backend.optimizer.param_groups[0]["lr"], rel=1e-9)
    assert logged_lr(tmp_path / "run")[20] == pytest.approx(logged_lr(tmp_path / "full")[20])
