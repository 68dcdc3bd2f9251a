"""CorruptionCheck on Megatron-Core: 2 data-parallel gloo ranks under torchrun; a bit
flipped in one parameter on rank 1 is found at the next check, naming the parameter (two
replicas, no majority: both ranks), and the run stops there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

pytest.importorskip("megatron.core")

WORKER = Path(__file__).with_name("corruption_worker.py")


@pytest.mark.slow
def test_a_flipped_bit_on_rank_1_is_named_and_stops_the_run(tmp_path: Path) -> None:
    torchrun(WORKER, str(tmp_path), nproc=2, timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert seen["findings"] == [
            {"step": 4, "parameter": "decoder.layers.0.mlp.linear_fc1.weight", "ranks": [0, 1]}
        ]
        assert seen["last_good_step"] == 2
        assert seen["step"] == 4
        # Adam's replicated state is covered too (no distributed optimizer here)
        assert {"exp_avg", "exp_avg_sq"} <= set(seen["states"])
        assert seen["refused"] == {}
