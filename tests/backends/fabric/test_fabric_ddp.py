"""Two CPU processes under torchrun: DDP through Fabric, flags agreed at the log cadence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.slow
def test_two_ranks_agree_on_weights_and_stop(tmp_path):
    torchrun(WORKER, str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world"] == 2 for r in ranks)
    assert ranks[0]["step"] == ranks[1]["step"] == 4
    assert ranks[1]["reason"] == "rank 1 asked"
    assert ranks[0]["reason"] == "requested on another rank"
    assert ranks[0]["param_hash"] == ranks[1]["param_hash"]
