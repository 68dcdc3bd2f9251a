"""One model, Megatron-Core: a Hugging Face Qwen3-MoE built as a ``GPTModel`` with
Megatron's own MoE layers (``TopKRouter``, ``SequentialMLP`` experts), its weights loaded
by baton's mapping: logits equal ``transformers'``; the first step's loss and
load-balancing loss are ``transformers'`` (the auxiliary loss by Megatron's per-layer
formula, the difference to ``transformers'`` measured); trained and exported back,
``transformers`` loads the trained model's logits; a capacity factor drops tokens and says
how many."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

import torch

from baton.backends.hf_io import read_safetensors
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from support.megatron_model import first_micro_batches, megatron_aux_loss, megatron_outputs
from support.tiny_qwen3 import save_tiny_qwen3

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
VOCAB = 512
#: one micro-batch a step: Megatron's load-balancing loss is per micro-batch
ONE_MICRO_BATCH = ["--batch-size", "4", "--global-batch-size", "4", "--eval-every", "0"]


class Record(Callback):
    def __init__(self) -> None:
        self.logs: dict[int, dict[str, float]] = {}
        self.parameters: dict[str, tuple[int, ...]] = {}

    def on_log(self, driver, metrics):
        self.logs[driver.step] = dict(metrics)

    def on_step_end(self, driver, output):
        pieces = driver.backend.model_state().parameters()
        self.parameters = {piece.name: piece.global_shape for piece in pieces}


def busiest_over_mean(router_logits, *, top_k: int) -> float:
    ratios = []
    for logits in router_logits:
        counts = torch.bincount(logits.topk(top_k, -1).indices.flatten(), minlength=4).float()
        ratios.append(float(counts.max() / counts.mean()))
    return max(ratios)


def test_qwen3_moe_logits_first_step_loss_and_export(tmp_path):
    from transformers import Qwen3MoeForCausalLM

    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=VOCAB)
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    argv = ["--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "2",
            "--no-async-save", "--log-every", "1", "--run-dir", str(tmp_path / "run"),
            "--no-progress", *ONE_MICRO_BATCH]  # fmt: skip
    driver = build_driver(RECIPE, argv)
    recorded = driver.options.settings["model_spec"]
    assert ModelSpec.from_dict(recorded) == ModelSpec.from_hf(hf_dir)  # the spec round-trips
    assert recorded["moe"]["num_experts"] == 4 and recorded["moe"]["norm_topk_prob"] is True
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits
    torch.testing.assert_close(
        megatron_outputs(driver.backend, tokens), expected, rtol=1e-4, atol=1e-4
    )

    (batch,) = first_micro_batches(build_driver(RECIPE, argv).backend)
    with torch.no_grad():
        out = reference(batch["tokens"], output_router_logits=True)
    lm = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten())
    megatron_aux = 0.01 * megatron_aux_loss(out.router_logits, top_k=2, experts=4)
    record = Record()
    driver.callbacks.append(record)
    driver.fit()
    first = record.logs[1]
    assert first["loss"] == pytest.approx(float(lm), rel=1e-5)  # Megatron's loss: no aux term
    assert first["moe/aux_loss"] == pytest.approx(float(megatron_aux), rel=1e-5)
    # transformers' term (all layers' tokens pooled, no division by top-k) differs from
    # Megatron's per-layer one; here by about 1%, a 4e-5 share of the total loss
    transformers_total = float(lm) + 0.01 * float(out.aux_loss)
    assert first["loss"] + first["moe/aux_loss"] == pytest.approx(transformers_total, rel=1e-4)
    assert first["moe/aux_loss"] != pytest.approx(0.01 * float(out.aux_loss), rel=1e-3)
    assert first["moe/load_balance"] == busiest_over_mean(out.router_logits, top_k=2)
    assert "moe/dropped_fraction" not in first  # dropless
    # model_state shows the experts (and router) by their Hugging Face names and shapes
    saved = read_safetensors(str(hf_dir))  # save_pretrained's names: one tensor an expert
    hf_shapes = {name: tuple(tensor.shape) for name, tensor in saved.items()}
    assert set(record.parameters) == set(hf_shapes)
    mlp = {name: shape for name, shape in record.parameters.items() if ".mlp." in name}
    assert len(mlp) == 2 * (1 + 4 * 3) and all(mlp[n] == hf_shapes[n] for n in mlp)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    exported = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        got = exported(tokens).logits
    reloaded = build_driver(RECIPE, [  # the checkpoint's own Megatron model
        "--model-config", str(hf_dir), "--init-from", str(checkpoint),
        "--run-dir", str(tmp_path / "ref"),
    ])  # fmt: skip
    torch.testing.assert_close(
        got, megatron_outputs(reloaded.backend, tokens), rtol=1e-4, atol=1e-4
    )
    assert not torch.allclose(got, expected, atol=1e-3)  # trained: not the start any more


def test_a_capacity_factor_drops_tokens_and_logs_the_fraction(tmp_path):
    """One MoE layer after a dense one (``mlp_only_layers``: Megatron's ``moe_layer_freq``),
    a capacity factor and Megatron's router z-loss (set on its native config)."""
    from transformers import Qwen3MoeForCausalLM

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=VOCAB, mlp_only_layers=[0])
    argv = ["--init-from", str(hf_dir), "--capacity-factor", "0.5", "--max-steps", "1",
            "--set", "model.moe_z_loss_coeff=0.001", "--save-every", "0", "--log-every", "1",
            "--run-dir", str(tmp_path / "run"), "--no-progress", *ONE_MICRO_BATCH]  # fmt: skip
    (batch,) = first_micro_batches(build_driver(RECIPE, argv).backend)
    driver = build_driver(RECIPE, argv)
    record = Record()
    driver.callbacks.append(record)
    driver.fit()
    logs = record.logs[1]
    # 256 tokens x top 2 over 4 experts at capacity 0.5: each expert keeps at most 64 of
    # the 512 slots, so at least half are dropped, and the busiest expert holds <= 64
    kept = 512 * (1 - logs["moe/dropped_fraction"])
    assert 0.5 <= logs["moe/dropped_fraction"] < 1.0
    assert logs["moe/load_balance"] * kept / 4 == pytest.approx(64.0)
    # the z-loss: coefficient x mean over tokens of logsumexp(router logits)^2 (ST-MoE);
    # the MoE layer follows the dense one, so its router sees transformers' inputs
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        (logits,) = reference(batch["tokens"], output_router_logits=True).router_logits
    expected = 0.001 * logits.logsumexp(-1).square().mean()
    assert logs["moe/z_loss"] == pytest.approx(float(expected), rel=1e-5)


def test_expert_parallel_sizes_are_checked_before_building(tmp_path):
    moe_dir = save_tiny_qwen3(tmp_path / "moe", moe=True, vocab_size=VOCAB)
    with pytest.raises(UsageError, match="--ep 3 must divide the model's 4 experts"):
        build_driver(RECIPE, ["--init-from", str(moe_dir), "--ep", "3"])
    with pytest.raises(UsageError, match="apply to a mixture-of-experts model"):
        build_driver(RECIPE, ["--capacity-factor", "1.0"])


def test_qwen3_30b_a3b_dry_run_plans_experts_and_memory(tmp_path, capsys):
    """The real-size recipe plans Qwen3-30B-A3B from its config.json alone."""
    import transformers

    transformers.Qwen3MoeConfig(
        num_hidden_layers=48, num_experts=128, num_experts_per_tok=8, hidden_size=2048,
        moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, vocab_size=151936, norm_topk_prob=True,
    ).save_pretrained(tmp_path / "qwen3-30b-a3b")  # fmt: skip
    recipe = RECIPE.with_name("megatron_llama3_8b.py")
    plan = ["--dry-run", "--model-config", str(tmp_path / "qwen3-30b-a3b")]
    assert (
        build_driver(recipe, [*plan, "--world-size", "64", "--tp", "1", "--pp", "2", "--ep", "8"])
        is None
    )
    out = capsys.readouterr().out
    assert "experts 128 in each of 48 MoE layers, top 8, FFN 768; 16 experts a rank" in out
    assert "world size 64 = tensor 1 x pipeline 2 x data 32; " in out
    assert "experts: expert 8 x expert tensor 1 x expert data 4" in out
    # 1.53 B dense (attention, embedding, output) and 29.0 B in experts; a rank holds half
    # the dense layers and 16 of 128 experts of half the layers: 0.76 + 1.81 B
    assert "parameters 30.53 B; per model-parallel rank 2.58 B; active per token 3.35 B" in out
    # bf16 weights and fp32 gradients (6 bytes a parameter), fp32 main weights and Adam
    # moments (12 bytes) over data 32 (dense) and expert data 4 (experts)
    assert "memory per rank 19.7 GiB" in out
    with pytest.raises(UsageError, match="--ep 3 must divide the model's 128 experts"):
        build_driver(recipe, [*plan, "--world-size", "64", "--ep", "3"])
    with pytest.raises(UsageError, match="expert parallel 16 x expert tensor parallel 2 does not"):
        build_driver(recipe, [*plan, "--world-size", "16", "--tp", "2", "--ep", "16"])


def test_the_expert_mapping_round_trips_bit_for_bit(tmp_path):
    """Hugging Face -> Megatron -> Hugging Face, a dense layer and a MoE layer."""
    from baton.backends.megatron.hf import hf_to_megatron, megatron_to_hf

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=VOCAB, mlp_only_layers=[0])
    spec = ModelSpec.from_hf(hf_dir)
    weights = read_safetensors(str(hf_dir))
    megatron = hf_to_megatron(weights, spec)
    fc1 = megatron["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"]
    assert fc1.shape == (64, 64)  # gate over up, 32 rows each
    assert "decoder.layers.0.mlp.linear_fc1.weight" in megatron  # the dense layer
    back = megatron_to_hf(megatron, spec)
    assert sorted(back) == sorted(weights)
    assert all(torch.equal(back[k], weights[k]) for k in weights)
