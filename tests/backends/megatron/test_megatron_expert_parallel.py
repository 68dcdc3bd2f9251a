"""Megatron-Core expert parallelism on CPU (2 gloo ranks under torchrun): a model with MoE
layers, 2 of its 4 experts on each rank, trains through baton's loop bit for bit as a
plain Megatron-Core loop with the same layout (plain.py); its checkpoint is refused under
another expert-parallel degree with both layouts named, and its weights start a run on
one rank; ``baton export`` of a Qwen3-MoE trained at expert parallel 2 (its replicas
checked each step by ``CorruptionCheck``) loads in ``transformers`` with the checkpoint's
logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

import torch

from baton.core.cli.recipe import build_driver
from support.megatron_model import first_micro_batches, megatron_aux_loss, megatron_outputs
from support.tiny_qwen3 import save_tiny_qwen3
from support.torchrun import torchrun

HERE = Path(__file__).parent
RECIPE = HERE.parents[2] / "recipes" / "megatron_gpt_tiny.py"


@pytest.mark.slow
def test_expert_parallel_2_equals_the_plain_loop_and_resumes_only_on_its_degree(tmp_path):
    out = tmp_path / "ep.json"
    torchrun(
        HERE / "worker.py",
        *("--steps", "3", "--save-at", "2", "--runs", "ep2,plain-ep2,moe@ep2"),
        *("--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "runs")),
        *("--out", str(out)),
    )
    result = json.loads(out.read_text())
    assert "error" not in result["ep2"], result["ep2"]
    assert result["ep2"]["losses"] == result["plain-ep2"]["losses"]  # bit for bit
    assert len(result["ep2"]["losses"]) == 3
    refused = result["moe@ep2"]["error"]
    assert "checkpoint has tensor=1, pipeline=1, virtual_pipeline=1, expert=2" in refused
    assert "this run has tensor=1, pipeline=1, virtual_pipeline=1, expert=1" in refused
    assert "optimizer state follows the expert-parallel degree" in refused


@pytest.mark.slow
def test_export_from_expert_parallel_2_loads_in_transformers(tmp_path):
    from transformers import Qwen3MoeForCausalLM

    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=512)
    torchrun(HERE / "hf_worker.py", str(RECIPE), *[
        "--init-from", str(hf_dir), "--ep", "2", "--max-steps", "2", "--save-every", "2",
        "--no-async-save", "--run-dir", str(tmp_path / "run"), "--no-progress", "--log-every", "1",
        # replicas compared each step: experts by global number (no false finding to stop on)
        "--callback", "corruption_check:every_n_steps=1",
    ])  # fmt: skip
    # the first step's loss and load-balancing loss over both ranks: transformers' on the
    # two micro-batches one rank would read (Megatron's aux loss: its per-layer formula,
    # averaged over micro-batches)
    first = json.loads((tmp_path / "run" / "logs" / "metrics.jsonl").read_text().splitlines()[0])
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    losses, aux = [], []
    single = build_driver(RECIPE, ["--init-from", str(hf_dir), "--run-dir", str(tmp_path / "one")])
    for batch in first_micro_batches(single.backend, 2):
        with torch.no_grad():
            out = reference(batch["tokens"], output_router_logits=True)
        logits, labels = out.logits.flatten(0, 1), batch["labels"].flatten()
        losses.append(torch.nn.functional.cross_entropy(logits, labels))
        aux.append(0.01 * megatron_aux_loss(out.router_logits, top_k=2, experts=4))
    assert first["step"] == 1 and first["loss"] == pytest.approx(float(sum(losses) / 2), rel=1e-5)
    assert first["moe/aux_loss"] == pytest.approx(float(sum(aux) / 2), rel=1e-5)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exported = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
        got = exported.eval()(tokens).logits
        start = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        assert not torch.allclose(got, start.eval()(tokens).logits, atol=1e-3)  # trained
    one_rank = build_driver(RECIPE, [  # the EP 2 weights, resharded onto one rank
        "--model-config", str(hf_dir), "--init-from", str(checkpoint),
        "--run-dir", str(tmp_path / "ref"),
    ])  # fmt: skip
    torch.testing.assert_close(
        got, megatron_outputs(one_rank.backend, tokens), rtol=1e-4, atol=1e-4
    )
