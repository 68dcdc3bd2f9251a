"""``self.log(..., on_epoch=True, sync_dist=True)`` under torchrun with 2 ranks: baton's
LightningBackend equals ``Trainer(strategy="ddp", devices=2)`` bit for bit on every rank
(each batch's loss, the synced validation and epoch values), and again after a resume
in fresh processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

WORKER = Path(__file__).with_name("lightning_ddp_worker.py")
STEPS, SAVE_AT = 32, 13


def run(tmp_path: Path, name: str, *args: str) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    torchrun(WORKER, args[0], str(out), *args[1:])
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_sync_dist_logging_equals_trainer_ddp_and_after_a_resume(tmp_path):
    expected = run(tmp_path, "trainer", "trainer", str(tmp_path / "trainer_run"))
    ours = run(tmp_path, "baton", "baton", str(tmp_path / "baton_run"), str(STEPS), "0", "none")
    resumed_dir = str(tmp_path / "resumed_run")
    run(tmp_path, "first", "baton", resumed_dir, str(SAVE_AT), str(SAVE_AT), "none")
    resumed = run(tmp_path, "resumed", "baton", resumed_dir, str(STEPS), "0", "auto")

    for rank in (0, 1):
        assert len(expected[rank]["losses"]) == STEPS
        assert ours[rank] == expected[rank]
        assert resumed[rank]["losses"] == expected[rank]["losses"][SAVE_AT:]
        later = len(resumed[rank]["validations"])
        assert later == 3 and resumed[rank]["validations"] == expected[rank]["validations"][-3:]
        # the epoch resumed in the middle aggregates only its batches after the resume
        # (Trainer.fit's own checkpoints do not keep these aggregates either)
        assert len(resumed[rank]["epochs"]) == 3
        assert resumed[rank]["epochs"][1:] == expected[rank]["epochs"][2:]
    # sync_dist: every rank holds the same averaged values, its own losses
    assert expected[0]["validations"] == expected[1]["validations"]
    assert expected[0]["epochs"] == expected[1]["epochs"] and len(expected[0]["epochs"]) == 4
    assert expected[0]["losses"] != expected[1]["losses"]
