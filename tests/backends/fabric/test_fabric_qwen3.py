"""Qwen3 and Qwen3-MoE on Fabric through ``transformers``: ``recipes/hf_finetune.py
--init-from`` a ``save_pretrained`` directory starts from its weights (the first loss is
``transformers``' own), records the spec, logs the MoE load-balancing term as
``moe/aux_loss`` and the expert load balance as ``moe/load_balance``, and ``baton export --format hf`` writes a directory ``transformers``
loads back with the trained model's logits."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from baton.core import Callback
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver
from support.tiny_qwen3 import save_tiny_qwen3

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "hf_finetune.py"


def _byte_batches():
    spec = importlib.util.spec_from_file_location("hf_finetune_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.byte_lm_data


class Record(Callback):
    def __init__(self) -> None:
        self.logs: dict[int, dict[str, float]] = {}

    def on_log(self, driver, metrics):
        self.logs[driver.step] = dict(metrics)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3_moe"])
def test_qwen3_init_from_trains_records_the_spec_and_exports(tmp_path, moe):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    source = save_tiny_qwen3(tmp_path / "source", moe=moe)
    run_dir = tmp_path / "run"
    args = ["--init-from", str(source), "--max-steps", "2", "--log-every", "1"]
    args += ["--eval-every", "0", "--save-every", "2", "--run-dir", str(run_dir)]
    first_batch = next(iter(_byte_batches()(seq_len=64, batch_size=8, seed=0, path=None)[0]))
    extra = {"output_router_logits": True} if moe else {}
    reference = AutoModelForCausalLM.from_pretrained(source, **extra)
    with torch.no_grad():
        out = reference(**first_batch)

    driver = build_driver(RECIPE, args)
    record = Record()
    driver.callbacks.append(record)
    driver.fit()
    # the first step's loss is transformers' loss of the source weights (with the
    # load-balancing term for the MoE): every weight arrived, experts included
    assert record.logs[1]["loss"] == pytest.approx(out.loss.item(), rel=1e-6)
    spec = driver.options.settings["model_spec"]
    assert (spec["family"], spec["head_dim"]) == ("qwen3_moe" if moe else "qwen3", 32)
    if moe:
        assert spec["moe"]["num_experts"] == 4 and spec["moe"]["experts_per_token"] == 2
        term = 0.01 * out.aux_loss.item()
        assert record.logs[1]["moe/aux_loss"] == pytest.approx(term, rel=1e-5)
        assert all(record.logs[s]["moe/aux_loss"] > 0 for s in (1, 2))
        # the busiest expert's share of the first batch's top-2 choices, worst layer
        balance = max(
            torch.bincount(layer.topk(2, dim=-1).indices.reshape(-1), minlength=4).max().item()
            / (layer.shape[0] * 2 / 4)
            for layer in out.router_logits
        )
        assert record.logs[1]["moe/load_balance"] == pytest.approx(balance, rel=1e-6)
        assert record.logs[1]["moe/load_balance"] > 1.0
    else:
        assert "moe/aux_loss" not in record.logs[1]

    out_dir = tmp_path / "exported"
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert baton(["export", str(checkpoint), "--format", "hf", str(out_dir)]) == 0
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == spec["family"]
    with safe_open(out_dir / "model.safetensors", "pt") as exported_file:
        names = set(exported_file.keys())
    with safe_open(source / "model.safetensors", "pt") as source_file:
        assert names == set(source_file.keys())  # save_pretrained's layout, per expert
    exported = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    trained = driver.backend.raw_model.eval()
    with torch.no_grad():
        ids = first_batch["input_ids"]
        torch.testing.assert_close(
            exported(input_ids=ids).logits, trained(input_ids=ids).logits, rtol=1e-4, atol=1e-5
        )
