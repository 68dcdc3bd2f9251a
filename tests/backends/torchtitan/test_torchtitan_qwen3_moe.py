"""One model, TorchTitan: a Hugging Face Qwen3-MoE (4 experts, top 2, renormalised top-k
weights; a dense first layer) built by TorchTitan's own qwen3 model and MoE layer, loaded and exported through
its own ``Qwen3StateDictAdapter``: logits equal ``transformers``', the first-step loss is
``transformers``' cross entropy (TorchTitan adds no auxiliary loss: the difference from
``transformers``' loss is exactly its ``router_aux_loss_coef`` term), ``moe/load_balance``
is the routing ``transformers`` computes on the same batch, and the export loads as
``Qwen3MoeForCausalLM`` with the trained model's logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("transformers")

import torch

from baton.core.callback import Callback
from baton.core.cli.recipe import build_driver
from baton.core.model.spec import ModelSpec
from support.tiny_qwen3 import save_tiny_qwen3
from support.titan_batches import first_byte_batch
from support.titan_model import sdpa_model

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH, VOCAB = 64, 2, 512
#: three layers, the first dense (mlp_only_layers): TorchTitan's feed-forward there
SHAPE = {"num_hidden_layers": 3, "mlp_only_layers": [0]}


class Logged(Callback):
    """Every logged metric, by step, and the ``model_state`` parameter names."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.names: set[str] = set()

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.steps[driver.step] = dict(metrics)

    def on_step_end(self, driver: Any, output: Any) -> None:
        self.names = {piece.name for piece in driver.backend.model_state().parameters()}


def hf_reference(model: Any, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``transformers``' cross entropy, load-balancing loss and expert load balance
    (busiest over mean tokens per expert, the largest over layers) on one batch."""
    experts = model.config.num_experts
    with torch.no_grad():
        out = model(inputs, output_router_logits=True)
    cross_entropy = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten())
    balance = 0.0
    for logits in out.router_logits:
        chosen = logits.topk(model.config.num_experts_per_tok, dim=-1).indices
        counts = torch.bincount(chosen.flatten(), minlength=experts).float()
        balance = max(balance, float(counts.max() / counts.mean()))
    return {"ce": float(cross_entropy), "aux": float(out.aux_loss), "balance": balance}


def test_qwen3_moe_logits_loss_balance_and_export_equal_transformers(tmp_path):
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
    from transformers import Qwen3MoeForCausalLM

    from baton.backends.hf_io import read_safetensors
    from baton.backends.torchtitan.export import dcp_folder, read_model_weights
    from baton.backends.torchtitan.qwen3 import qwen3_model_config
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=VOCAB, **SHAPE)
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    spec = ModelSpec.from_hf(hf_dir)
    assert spec.moe is not None and spec.moe.dense_layers == (0,)
    config = qwen3_model_config(spec)
    model = sdpa_model(config)
    adapter = Qwen3StateDictAdapter(config, None)
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.load_state_dict(adapter.from_hf(read_safetensors(hf_dir)))
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=1e-4, atol=1e-4)

    logged = Logged()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "1", "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--log-every", "1", "--save-every", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(logged)
    driver.fit()
    assert driver.backend.config.model_spec.name == "qwen3"
    assert ModelSpec.from_dict(driver.options.settings["model_spec"]) == spec
    first = logged.steps[1]
    hf = hf_reference(reference, *first_byte_batch(SEQ, BATCH))
    # TorchTitan's loss is the cross entropy alone; transformers adds coef x aux
    assert first["loss"] == pytest.approx(hf["ce"], rel=1e-4)
    assert hf["aux"] > 1.0  # so the term the two losses differ by is not negligible
    assert first["moe/load_balance"] == pytest.approx(hf["balance"], rel=1e-6)
    assert "moe/aux_loss" not in first and "moe/dropped_fraction" not in first
    # Hugging Face names, but a grouped expert weight is one tensor for every expert's
    assert {"model.layers.1.mlp.gate.weight", "model.layers.1.self_attn.q_norm.weight",
            "layers.1.moe.routed_experts.inner_experts.w2_EDF"} <= logged.names  # fmt: skip

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    assert ModelSpec.from_hf(tmp_path / "out") == spec
    exported = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    trained = adapter.to_hf(read_model_weights(dcp_folder(checkpoint)))
    with torch.no_grad():
        model.load_state_dict(adapter.from_hf(trained))
        torch.testing.assert_close(exported(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)


def test_qwen3_30b_a3b_dry_run_plans_expert_parallelism(tmp_path, capfd):
    """The real-size recipe plans Qwen3-30B-A3B (its config.json, written here) on EP x
    TP x PP x FSDP without building it; an expert-parallel degree that does not divide
    the experts, or one for a model without experts, is refused by name."""
    from transformers import Qwen3MoeConfig

    from baton.core.errors import UsageError

    Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, max_position_embeddings=40960,
    ).save_pretrained(tmp_path / "a3b")  # fmt: skip
    recipe = RECIPE.parent / "torchtitan_llama3_8b.py"
    flags = ["--dry-run", "--model-config", str(tmp_path / "a3b"), "--seq-len", "4096"]
    layout = ["--ep", "4", "--tp", "2", "--pp", "2", "--batch-size", "2", "--world-size", "32"]
    assert build_driver(recipe, [*flags, *layout]) is None
    plan = capfd.readouterr().out
    assert "30.53 B parameters" in plan
    assert "32 = dp_replicate 1 x dp_shard (FSDP) 8 x cp 1 x tp 2 x pp 2 (ep 4)" in plan
    assert "128 per MoE layer x 48 layers, top 8; ep 4: 32 experts/rank" in plan
    assert "28.99 B in experts, 3.35 B active per token" in plan
    assert "~14.2 GiB/rank of weights, grads and AdamW state" in plan
    with pytest.raises(
        UsageError,
        match="--ep 3 does not divide the model's 128 experts; use a --ep that divides 128",
    ):
        build_driver(recipe, [*flags, "--ep", "3", "--world-size", "3"])
    with pytest.raises(UsageError, match="expert parallel degree 2 needs a mixture-of-expe"):
        build_driver(recipe, ["--dry-run", "--ep", "2"])  # Llama 3 8B has no experts


def test_expert_bias_balancing_trains_and_its_export_is_refused(tmp_path, capfd):
    """``--expert-bias``: TorchTitan's auxiliary-loss-free balancing updates the expert
    bias; Hugging Face's Qwen3-MoE has none, so the export is refused by name. A model
    without experts refuses the flag, and a run of one refuses --ep."""
    from baton.core.errors import UsageError
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, vocab_size=VOCAB)
    args = ["--max-steps", "1", "--seq-len", str(SEQ), "--batch-size", str(BATCH),
            "--run-dir", str(tmp_path / "run"), "--no-progress", "--expert-bias", "0.001"]  # fmt: skip
    driver = build_driver(RECIPE, ["--init-from", str(hf_dir), *args])
    assert driver is not None
    driver.fit()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    capfd.readouterr()
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 2
    assert "layers.0.moe.expert_bias_E is not zero" in capfd.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="--expert-bias balances the experts"):
        build_driver(RECIPE, args)
    dense = build_driver(RECIPE, ["--ep", "2", "--run-dir", str(tmp_path / "dense")])
    assert dense is not None
    with pytest.raises(UsageError, match="expert parallel degree 2 needs a mixture-of-expe"):
        dense.fit()  # refused before TorchTitan builds anything
