"""One model, MaxText: a Hugging Face Qwen3 and Qwen3-MoE built by MaxText's own ``qwen3``
and ``qwen3_moe`` decoder blocks (``recipes/maxtext_tiny.py --init-from HF_DIR``), started
from their weights and exported back. Two MaxText runs (imports take 20-40 s): a dense
Qwen3 of one step, a Qwen3-MoE of two steps serving the logits, the auxiliary loss, the
metrics, the recorded spec and the export; an expert-parallel run with a capacity factor
against MaxText's own loop (a fresh process); and the
real-size recipe's ``--dry-run`` of Qwen3-30B-A3B in its own process, started first so
that it overlaps with the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("maxtext")
pytest.importorskip("transformers")

import torch
from backends.maxtext.maxtext_support import in_background

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec
from support.maxtext_forward import maxtext_aux_loss
from support.tiny_qwen3 import save_tiny_qwen3

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
REAL_SIZE_RECIPE = RECIPE.with_name("maxtext_llama2_7b.py")
SEQ, BATCH = 64, 2
#: Qwen3-30B-A3B's config.json, as Qwen3MoeConfig writes it
QWEN3_30B_A3B = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "max_position_embeddings": 40960,
    "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def qwen3_30b_dry_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start the real-size recipe's ``--dry-run`` of Qwen3-30B-A3B on 16 simulated
    devices (expert 8 x fsdp 2) in the background; its test collects it."""
    from transformers import Qwen3MoeConfig

    run_dir = tmp_path_factory.mktemp("qwen3_30b_dry_run")
    Qwen3MoeConfig(**QWEN3_30B_A3B).save_pretrained(run_dir / "qwen3-30b-a3b")
    command = [
        sys.executable, "-m", "baton.core.cli.command", "run", str(REAL_SIZE_RECIPE), "--dry-run",
        "--world-size=16", "--ep=8", "--dp-shard=2", "--batch-size=2",
        f"--model-config={run_dir / 'qwen3-30b-a3b'}", f"--run-dir={run_dir / 'run'}",
    ]  # fmt: skip
    with in_background(command, run_dir) as process:
        yield process


class Logged(Callback):
    """Every log step's metrics (``steps[step] = {name: value}``), and the model's logits
    on the first batch before the first step (``first_logits``)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.first_logits: torch.Tensor | None = None

    def on_train_start(self, driver: Any) -> None:
        from support.maxtext_forward import logits

        tokens, _ = batch_tensors(0)
        self.first_logits = torch.from_numpy(logits(driver.backend, tokens.numpy()))

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.steps[driver.step] = dict(metrics)


def train(
    hf_dir: Path, run_dir: Path, steps: int, *extra: str, overrides: tuple[str, ...] = ()
) -> tuple[Any, Logged]:
    logged = Logged()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", str(steps), "--log-every", "1",
        "--eval-every", "0", "--batch-size", str(BATCH), "--seq-len", str(SEQ),
        "--run-dir", str(run_dir), "--no-progress", *extra,
        "--overrides", "dtype=float32", *overrides,
    ])  # fmt: skip
    driver.callbacks.append(logged)
    driver.fit()
    return driver, logged


def batch_tensors(index: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and targets the run reads at its step ``index + 1``."""
    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus

    batches = TextBatches(TextCorpus.load(None).train, batch_size=batch, seq_len=SEQ)
    batches.skip_to(index)
    batch = next(batches)
    return tuple(torch.from_numpy(batch[k]).long() for k in ("inputs", "targets"))  # type: ignore[return-value]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def expert_load(
    router_logits: tuple[torch.Tensor, ...], top_k: int, capacity_factor: float, batch: int = BATCH
) -> tuple[float, float]:
    """The busiest expert's slots over the mean (the largest over layers) and the dropped
    fraction of the slots (mean over layers) MaxText's router gives ``transformers``'
    router logits: capacity per sequence, slots dropped in token order."""
    import math

    ratios, dropped = [], []
    for logits in router_logits:
        experts = logits.shape[-1]
        chosen = torch.topk(logits, top_k, dim=-1).indices.view(batch, SEQ * top_k)
        slots = torch.nn.functional.one_hot(chosen, experts)
        ratios.append(float(slots.sum((0, 1)).max()) / (batch * SEQ * top_k / experts))
        capacity = max(math.ceil(SEQ * top_k / experts) * capacity_factor, capacity_factor)
        position = slots.cumsum(1) * slots
        over = (position > int(capacity)).sum() if capacity_factor > 0 else 0
        dropped.append(float(over) / (batch * SEQ * top_k))
    return max(ratios), sum(dropped) / len(dropped)


def test_qwen3_dense_logits_and_first_loss_equal_transformers(tmp_path):
    from transformers import Qwen3ForCausalLM

    hf_dir = save_tiny_qwen3(tmp_path / "hf")
    driver, logged = train(hf_dir, tmp_path / "run", 1, "--no-callback", "checkpoint")
    tokens, targets = batch_tensors(0)
    reference = Qwen3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected_logits = reference(tokens).logits
    expected = cross_entropy(expected_logits, targets)
    torch.testing.assert_close(logged.first_logits, expected_logits, rtol=1e-4, atol=1e-4)
    assert logged.steps[1]["loss"] == pytest.approx(expected, rel=1e-4)
    assert "moe/aux_loss" not in logged.steps[1]
    assert driver.options.settings["model_spec"] == ModelSpec.from_hf(hf_dir).to_dict()


def test_qwen3_moe_logits_aux_loss_and_export_match_transformers(tmp_path):
    """Step 1: MaxText's cross entropy is transformers' (the logits), its loss adds its
    own load-balancing formula (differences from transformers' named in the docs); the
    checkpoint after step 1 exports to a Qwen3MoeForCausalLM whose cross entropy on
    batch 2 is MaxText's at step 2."""
    from transformers import Qwen3MoeForCausalLM

    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True)
    spec = ModelSpec.from_hf(hf_dir)
    assert spec.moe is not None
    driver, logged = train(hf_dir, tmp_path / "run", 2, "--save-every", "1", "--no-async-save")
    assert driver.options.settings["model_spec"] == spec.to_dict()

    tokens, targets = batch_tensors(0)
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference(tokens, labels=targets, output_router_logits=True)
    xent = cross_entropy(out.logits, targets)
    torch.testing.assert_close(logged.first_logits, out.logits, rtol=1e-4, atol=1e-4)
    first = logged.steps[1]
    assert first["lm_loss"] == pytest.approx(xent, rel=1e-4)
    moe = spec.moe
    aux = maxtext_aux_loss(
        out.router_logits, top_k=moe.experts_per_token, coef=moe.aux_loss_coef, sequences=BATCH
    )
    assert first["moe/aux_loss"] == pytest.approx(aux, rel=1e-4)
    assert first["loss"] == pytest.approx(xent + aux, rel=1e-4)
    hf_aux = spec.moe.aux_loss_coef * float(out.aux_loss)
    # the same scale (coef * top_k at perfect balance), another averaging (per sequence
    # and per layer): 0.02046 against 0.02001 here
    assert first["moe/aux_loss"] == pytest.approx(hf_aux, rel=0.05)
    balance, dropped = expert_load(out.router_logits, spec.moe.experts_per_token, -1.0)
    assert first["moe/load_balance"] == pytest.approx(balance, rel=1e-6)
    assert balance > 1.0
    assert first["moe/dropped_fraction"] == dropped == 0.0

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    assert ModelSpec.from_hf(tmp_path / "out") == spec
    exported = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    tokens, targets = batch_tensors(1)
    with torch.no_grad():
        assert logged.steps[2]["lm_loss"] == pytest.approx(
            cross_entropy(exported(tokens).logits, targets), rel=1e-4
        )


def test_expert_parallel_2_equals_maxtext_loop_and_logs_dropped_tokens(tmp_path):
    """``expert_parallel_run.py`` (a fresh process: 2 simulated devices): baton's losses
    on an expert-parallel mesh are MaxText's own ``train_loop``'s, bit for bit, and its
    checkpoint continues on fsdp 2. With
    capacity_factor 0.5 each expert takes half its mean share of a sequence's slots (16
    of 128): the dropped fraction logged is what MaxText's masks drop from transformers'
    routing of the same weights. One layer: a second layer's inputs would differ from
    transformers' (dropless) by the first layer's drops."""
    import json

    from transformers import Qwen3MoeForCausalLM

    hf_dir = save_tiny_qwen3(tmp_path / "hf", moe=True, num_hidden_layers=1)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    script = Path(__file__).with_name("expert_parallel_run.py")
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(script), str(out), str(tmp_path), str(hf_dir)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["layout"]["mesh"] == {"expert": 2} and report["layout"]["devices"] == 2
    assert sorted(report["losses"]) == ["1", "2", "3"]
    assert report["losses"] == report["reference"]  # bit for bit
    # the step-2 checkpoint restored onto fsdp 2 (orbax reshards the experts) goes on
    assert report["checkpoint"] == "step_000002"
    assert report["continued_layout"]["mesh"] == {"fsdp": 2}
    assert report["continued"]["3"] == pytest.approx(report["losses"]["3"], rel=1e-4)

    tokens, _ = batch_tensors(0, batch=4)  # 2 sequences a device
    reference = Qwen3MoeForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        router_logits = reference(tokens, output_router_logits=True).router_logits
    balance, dropped = expert_load(router_logits, 2, 0.5, batch=4)
    assert 0.4 < dropped < 0.8
    first = report["metrics"]["1"]
    assert first["moe/dropped_fraction"] == pytest.approx(dropped, rel=1e-6)
    assert first["moe/load_balance"] == pytest.approx(balance, rel=1e-6)


@pytest.mark.parametrize(
    ("config", "ep", "named"),
    [({"moe": True}, 3, "does not divide the model's 4 experts"),
     ({"moe": False}, 2, "this qwen3 model has no experts to split")],
)  # fmt: skip
def test_an_expert_parallel_degree_that_cannot_split_the_experts_is_refused(
    tmp_path, config, ep, named
):
    from baton.data import train_tokenizer

    hf_dir = save_tiny_qwen3(tmp_path / "hf", **config)
    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=300).path  # the real size needs one
    args = ["--model-config", str(hf_dir), "--ep", str(ep), "--run-dir", str(tmp_path / "run")]
    for recipe in (RECIPE, REAL_SIZE_RECIPE):
        with pytest.raises(UsageError, match=named):
            build_driver(recipe, [*args, "--data-path", "d", "--tokenizer", str(tokenizer)]
                         if recipe == REAL_SIZE_RECIPE else args)  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"norm_topk_prob": False}, "norm_topk_prob"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ],
)
def test_unbuildable_experts_are_refused_by_name_before_building(tmp_path, change, named):
    from baton.backends.maxtext.hf import maxtext_settings

    config = ModelSpec.from_hf_dict({
        "model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
        **change,
    })  # fmt: skip
    with pytest.raises(UsageError, match=named):
        maxtext_settings(config)


def test_qwen3_30b_a3b_dry_run_plans_experts_and_memory(
    qwen3_30b_dry_run: subprocess.Popen[str],
) -> None:
    stdout, stderr = qwen3_30b_dry_run.communicate(timeout=600)
    assert qwen3_30b_dry_run.returncode == 0, stderr[-4000:]
    assert "mesh         fsdp=2  expert=8" in stdout, stdout
    assert "parameters   30,532,122,624 (30.53 B)" in stdout  # Qwen3-30B-A3B
    assert "32 x 4096 tokens per step" in stdout
    # fp32 weights, every one sharded 16 ways: 30.53e9 * 4 / 16 bytes
    assert "memory       7.11 GiB of weights per device, 21.33 GiB with AdamW" in stdout
