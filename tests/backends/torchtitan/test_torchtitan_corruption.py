"""CorruptionCheck on TorchTitan: HSDP with 2 replicas (``dp_replicate`` 2) under
torchrun on gloo; a bit flipped in one parameter on rank 1 is found at the next check,
naming the parameter (two replicas, no majority: both ranks), and the run stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.torchrun import torchrun

pytest.importorskip("torchtitan")

WORKER = Path(__file__).with_name("corruption_worker.py")


@pytest.mark.slow
def test_a_flipped_bit_on_one_replica_is_named_and_stops_the_run(tmp_path: Path) -> None:
    torchrun(WORKER, str(tmp_path), nproc=2, timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert seen["findings"] == [
            {"step": 4, "parameter": "layers.0.feed_forward.w1.weight", "ranks": [0, 1]}
        ]
        assert seen["step"] == 4
        assert {"exp_avg", "exp_avg_sq"} <= set(seen["states"])


def test_replicas_are_keyed_by_shard_and_a_layout_without_one_is_refused() -> None:
    from types import SimpleNamespace

    from baton.backends.torchtitan.checksums import replica_refusal, shard_suffix

    hsdp = SimpleNamespace(pp=1, dp_replicate=2, dp_shard=2, cp=1, tp=1)
    # world mesh (dp_replicate, dp_shard): ranks 0 and 2 hold shard 0, 1 and 3 shard 1
    assert [shard_suffix(hsdp, r) for r in range(4)] == ["@0", "@1", "@0", "@1"]
    staged = SimpleNamespace(pp=2, dp_replicate=2, dp_shard=1, cp=1, tp=1)
    assert [shard_suffix(staged, r) for r in range(4)] == ["@0", "@0", "@1", "@1"]
    assert shard_suffix(SimpleNamespace(pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=1), 1) == ""
    assert replica_refusal(hsdp) is None
    refused = replica_refusal(SimpleNamespace(pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1))
    assert refused is not None and "data_parallel_replicate_degree > 1" in refused
