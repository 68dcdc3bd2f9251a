"""Resume semantics: changed training settings are refused (or allowed by name, logged
and recorded), and logs continue after a resume without repeating steps."""

from __future__ import annotations

import json

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.checkpoints import files as ckpt

from .conftest import run_recipe, snapshot


def interrupted_run(capsys, run_dir, sinks: str = "jsonl") -> None:
    """Train to step 5 with a checkpoint at 3 (and 5), then lose the one at 5, as a run
    killed after logging steps 4 and 5 but before saving them would."""
    assert run_recipe(capsys, run_dir, "--max-steps", "5", "--sinks", sinks)[0] == 0
    ckpt.remove_checkpoint(run_dir / "checkpoints" / "step_000005")
    ckpt.update_latest(run_dir / "checkpoints", run_dir / "checkpoints" / "step_000003")


def test_changed_training_settings_are_refused_naming_how_to_force(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path, "--max-steps", "3")[0] == 0
    before = snapshot(tmp_path)
    status, err = run_recipe(
        capsys, tmp_path, "--resume", "auto", "--lr", "0.05", "--batch-size", "4"
    )
    assert status == 2, err
    assert "would change batch_size (2 -> 4), lr (0.1 -> 0.05)" in err
    assert "--allow-changed batch_size,lr" in err
    assert snapshot(tmp_path) == before


def test_an_allowed_change_is_logged_and_recorded(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path, "--max-steps", "3")[0] == 0
    status, err = run_recipe(
        capsys, tmp_path, "--resume", "auto", "--max-steps", "6", "--allow-changed", "max_steps"
    )
    assert status == 0, err
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000006")
    assert meta["settings"]["max_steps"] == 6
    assert meta["resume_changes"] == [
        {
            "step": 3,
            "changes": {"max_steps": {"checkpoint": 3, "now": 6, "applied_by": "driver"}},
        }
    ]


def test_an_allowed_change_is_announced_once(tmp_path, capsys):
    assert run_recipe(capsys, tmp_path, "--max-steps", "3")[0] == 0
    status, out = run_recipe(
        capsys, tmp_path, "--resume", "auto", "--max-steps", "6", "--allow-changed", "max_steps"
    )
    assert status == 0, out
    lines = out.splitlines()
    warned = [line for line in lines if "resuming with max_steps changed from 3 to 6" in line]
    assert len(warned) == 1, out
    assert "WARNING" in warned[0]
    assert len([line for line in lines if "resuming with the driver's max_steps 6" in line]) == 1


def test_an_allowed_change_no_one_applies_is_refused(tmp_path, capsys):
    interrupted_run(capsys, tmp_path)
    before = snapshot(tmp_path)
    status, err = run_recipe(
        capsys,
        tmp_path,
        "--max-steps",
        "5",
        "--resume",
        "auto",
        "--batch-size",
        "4",
        "--allow-changed",
        "batch_size",
    )
    assert status == 2, err
    assert "with batch_size changed (2 -> 4): backend 'scalar' cannot apply" in err
    assert "resume with the checkpoint's value (--batch-size 2)" in err
    assert "start a new run in another run directory" in err
    assert snapshot(tmp_path) == before


def test_jsonl_rows_past_the_resumed_step_are_dropped(tmp_path, capsys):
    interrupted_run(capsys, tmp_path)
    metrics = tmp_path / "logs" / "metrics.jsonl"
    assert [r["step"] for r in read_jsonl(metrics)] == [1, 2, 3, 4, 5]
    status, err = run_recipe(capsys, tmp_path, "--max-steps", "5", "--resume", "auto")
    assert status == 0, err
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]  # each step once, in order


def test_tensorboard_purges_steps_past_the_resumed_one(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    interrupted_run(capsys, tmp_path, sinks="tensorboard")
    status, err = run_recipe(
        capsys, tmp_path, "--max-steps", "5", "--resume", "auto", "--sinks", "tensorboard"
    )
    assert status == 0, err
    events = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]


def test_wandb_run_is_resumed_not_restarted(tmp_path, capsys):
    from baton.callbacks.sinks.wandb import WandbSink

    interrupted_run(capsys, tmp_path, sinks="wandb")
    run_id = (tmp_path / "logs" / "wandb_run_id").read_text()
    status, err = run_recipe(
        capsys, tmp_path, "--max-steps", "5", "--resume", "auto", "--sinks", "wandb"
    )
    assert status == 0, err
    runs = sorted((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    # W&B names offline runs offline-run-<time>-<id>, adding "-1" when two share a second
    assert len(runs) == 2 and all(f"-{run_id}" in r.name for r in runs)

    class Resumed:  # online, a resumed run rewinds the W&B run to the resumed step
        resumed_from = tmp_path / "checkpoints" / "step_000003"
        step = 3

    online = WandbSink(mode="online").resume_arguments(run_id, True, Resumed())
    assert online == {"resume_from": f"{run_id}?_step=3"}
