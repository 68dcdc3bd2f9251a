"""CorruptionCheck under torchrun with 3 CPU ranks: a bit flipped in one parameter on
rank 2 is found at the next check, naming that rank and parameter; the run stops
unsaved, or rolls back and ends bitwise equal to the same rollback without the flip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.callbacks import CorruptionCheck
from baton.callbacks.corruption_check import disagreements
from baton.core import checkpointing as ckpt
from support.torchrun import torchrun

WORKER = Path(__file__).with_name("corruption_worker.py")


@pytest.mark.slow
def test_a_flipped_bit_on_one_rank_is_named_then_stopped_or_rolled_back(tmp_path):
    torchrun(WORKER, str(tmp_path), nproc=3, timeout=400)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    flipped = ranks[0]["flipped"]
    for seen in ranks:
        # every rank found the same thing at the first check after the flip (step 6)
        assert seen["stop"]["findings"] == [{"step": 6, "parameter": flipped, "ranks": [2]}]
        assert seen["stop"]["step"] == 6
        assert seen["rollback"]["findings"] == seen["stop"]["findings"]
        assert seen["rollback"]["step"] == 8
    # after the rollback every replica agrees again, bit for bit, with the same timeline
    # never corrupted (a rollback to step 4 before step 7). That timeline is not compared
    # with the unhindered run: under Fabric DDP a rolled-back replay differs from it
    # (without any corruption; with one process it is bitwise equal)
    plain = {seen["plain_rollback"]["param_hash"] for seen in ranks}
    assert len(plain) == 1
    assert {seen["rollback"]["param_hash"] for seen in ranks} == plain
    # the corrupt state was never saved: the stopped run ends at the last clean checkpoint
    saved = [p.name for p in ckpt.list_checkpoints(tmp_path / "stop" / "checkpoints")]
    assert saved == [ckpt.checkpoint_name(2), ckpt.checkpoint_name(4)]
    rolled = [p.name for p in ckpt.list_checkpoints(tmp_path / "rollback" / "checkpoints")]
    assert rolled == [ckpt.checkpoint_name(s) for s in (2, 4, 6, 8)]


def test_majority_names_the_odd_rank_and_two_replicas_name_both():
    assert disagreements([{"w": "a", "b": "x"}] * 4) == []
    assert disagreements([{"w": "a"}, {"w": "b"}, {"w": "a"}]) == [("w", [1])]
    assert disagreements([{"w": "a"}, {"w": "b"}]) == [("w", [0, 1])]
    with pytest.raises(ValueError, match="action must be"):
        CorruptionCheck(action="explode")  # pyright: ignore[reportArgumentType]
