"""TorchTitan's parallel layouts under baton on CPU ranks (gloo), against Trainer.train().

Two launches run every multi-rank scenario (``layouts_worker.py``): two torchrun agents
as two "nodes" of one rank each (c10d rendezvous on 127.0.0.1) run FSDP 2 with a save
and a resume, the FSDP checkpoint resumed on tensor parallel 2 (refused, then
resharded), pipeline parallel 2 and tensor parallel 2; four ranks run FSDP 2 x TP 2.
The FSDP checkpoint is also resharded onto one process here.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

from support.torchrun import torchrun, torchrun_nodes

pytest.importorskip("torchtitan")

HERE = Path(__file__).parent
WORKER = HERE / "layouts_worker.py"
LAYOUT_FSDP = "dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1, world_size=2"
LAYOUT_TP = "dp_replicate=1, dp_shard=1, cp=1, tp=2, pp=1, world_size=2"

pytestmark = pytest.mark.slow


def _ranks(out: Path, mode: str, count: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{mode}_rank{r}.json").read_text()) for r in range(count)]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("nodes")
    torchrun_nodes(WORKER, "nodes", str(out), nnodes=2)
    return out, _ranks(out, "nodes", 2)


def _steps(losses: dict[str, float], first: int, last: int) -> dict[str, float]:
    return {str(s): losses[str(s)] for s in range(first, last + 1)}


def test_two_nodes_ranks_and_fsdp_checkpoint_written_once_and_resumed(nodes):
    out, ranks = nodes
    for rank, facts in enumerate(ranks):
        launch = facts["launch"]
        assert (launch["rank"], launch["node_rank"], launch["local_rank"]) == (rank, rank, 0)
        assert (launch["world_size"], launch["num_nodes"], launch["source"]) == (2, 2, "torchrun")
    checkpoints = out / "fsdp" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000002"]
    step = checkpoints / "step_000002"
    assert sorted(p.name for p in step.iterdir()) == ["backend", "baton.json"]
    dcp = step / "backend" / "step-2"
    assert sorted(p.name for p in dcp.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    record = json.loads((step / "baton.json").read_text())["checkpoint"]
    assert record["layout"]["dp_shard"] == 2 and record["samples"] > 0
    # the resume continues with the same losses, the same state, step and callback state
    first = ranks[0]
    assert first["fsdp_resumed_losses"] == _steps(first["fsdp_losses"], 3, 4)
    assert ranks[1]["fsdp_resumed_losses"] == first["fsdp_resumed_losses"]
    assert first["fsdp_resumed_start"] == {"step": 2, "count": 2}
    assert all(r["fsdp_resumed_state_equal"] for r in ranks)


def test_fsdp_checkpoint_on_tensor_parallel_refused_then_resharded(nodes):
    _, ranks = nodes
    for facts in ranks:
        refused = facts["tp_refused"]
        assert refused is not None and LAYOUT_FSDP in refused and LAYOUT_TP in refused
        assert "reshard_data='restart'" in refused
        # resharded through DCP: every weight and optimizer tensor equal after the load
        assert facts["tp_resharded_state_equal"] is True
        assert facts["tp_resharded_tensors"] > 50
        assert facts["tp_resharded_start"] == {"step": 2, "count": 2}
        losses = facts["tp_resharded_losses"]
        assert sorted(losses) == ["3", "4"] and all(math.isfinite(v) for v in losses.values())


def test_pipeline_parallel_2_equals_trainer_train(nodes):
    _, ranks = nodes
    # TorchTitan logs the loss on the last stage's rank; rank 0 holds its placeholder
    reference = ranks[1]["pp_reference"]
    assert all(v < 0 for v in ranks[0]["pp_reference"].values())
    assert sorted(reference) == ["1", "2", "3", "4"]
    for facts in ranks:  # baton reports the last stage's loss on every rank
        assert facts["pp_losses"] == reference


def test_tensor_parallel_2_equals_trainer_train(nodes):
    _, ranks = nodes
    for facts in ranks:
        assert sorted(facts["tp_reference"]) == ["1", "2", "3", "4"]
        assert facts["tp_losses"] == facts["tp_reference"]


def test_fsdp_x_tp_on_4_ranks_equals_trainer_train(tmp_path):
    torchrun(WORKER, "grid", str(tmp_path), nproc=4)
    ranks = _ranks(tmp_path, "grid", 4)
    reference = ranks[0]["grid_reference"]
    assert sorted(reference) == ["1", "2", "3", "4"]
    for facts in ranks:
        assert facts["grid_losses"] == facts["grid_reference"] == reference


def test_fsdp_checkpoint_resharded_onto_one_process(nodes, tmp_path):
    """2 ranks -> 1: DCP gathers the FSDP shards; refused without ``reshard_data``."""
    import torch

    spec = importlib.util.spec_from_file_location("layouts_worker", WORKER)
    assert spec is not None and spec.loader is not None
    layouts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layouts)
    out, _ = nodes
    checkpoint = out / "fsdp" / "checkpoints" / "step_000002"
    saved = torch.load(out / "fsdp_state_step2.pt")
    config = layouts.layout_config(tmp_path / "t", dp_shard=1)
    losses, _, facts = layouts.run(
        config, tmp_path / "one", resume=checkpoint, reshard_data="restart"
    )
    assert facts.start == {"step": 2, "count": 2}
    assert layouts.same(facts.state, saved)
    assert sorted(losses) == [3, 4]
