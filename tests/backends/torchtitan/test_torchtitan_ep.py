"""TorchTitan's expert parallelism under baton on two CPU ranks (gloo; ``ep_worker.py``):
a tiny Qwen3-MoE on FSDP 2 x EP 2 trains with exactly the losses of TorchTitan's own
``Trainer.train()`` on that layout, records ``ep`` in its checkpoint's layout, its
step-2 checkpoint resumes on EP 1 through DCP's resharding with the same losses, and
``moe/load_balance`` is the same on EP 2 and EP 1 (every rank's tokens counted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.tiny_qwen3 import save_tiny_qwen3
from support.torchrun import torchrun

pytest.importorskip("torchtitan")
pytest.importorskip("transformers")

WORKER = Path(__file__).parent / "ep_worker.py"

pytestmark = pytest.mark.slow


def test_expert_parallel_2_equals_trainer_train_and_resumes_on_ep_1(tmp_path):
    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=512)
    torchrun(WORKER, str(hf_dir), str(tmp_path), nproc=2)
    ranks = [json.loads((tmp_path / f"ep_rank{r}.json").read_text()) for r in range(2)]
    reference = ranks[0]["ep2_reference"]
    assert sorted(reference) == ["1", "2", "3", "4"]
    for facts in ranks:
        assert facts["ep2_losses"] == facts["ep2_reference"] == reference
        assert facts["ep2_layout"] == {
            "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1, "pp": 1, "ep": 2, "world_size": 2
        }  # fmt: skip
        # EP 2 -> EP 1: DCP reshards the experts; the run continues where it stopped
        assert facts["ep1_resumed_start"]["step"] == 2
        assert facts["ep1_resumed_losses"] == {s: reference[s] for s in ("3", "4")}
        # moe/load_balance counts both ranks' tokens, whichever rank holds the experts
        assert sorted(facts["ep2_balance"]) == ["1", "2", "3", "4"]
        assert facts["ep2_balance"] == facts["ep1_balance"] == ranks[0]["ep2_balance"]
        assert all(value >= 1.0 for value in facts["ep2_balance"].values())
