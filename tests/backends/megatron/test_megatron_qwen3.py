"""One model, Megatron-Core: a dense Hugging Face Qwen3 built as a ``GPTModel`` with QK
layer norm (and head_dim above hidden / heads), its weights loaded by baton's mapping:
logits equal ``transformers``'; trained and exported back, ``transformers`` loads the
trained model's logits."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

import torch

from baton.core.cli.recipe import build_driver
from support.megatron_model import megatron_outputs
from support.tiny_qwen3 import save_tiny_qwen3

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
VOCAB = 512


def test_qwen3_logits_equal_transformers_train_and_export(tmp_path):
    from transformers import Qwen3ForCausalLM

    from baton.tools.export import main as export_main

    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    hf_dir = save_tiny_qwen3(tmp_path / "hf", vocab_size=VOCAB)
    reference = Qwen3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "2",
        "--no-async-save", "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    assert driver.options.settings["model_spec"]["family"] == "qwen3"
    with torch.no_grad():
        expected = reference(tokens).logits
    torch.testing.assert_close(
        megatron_outputs(driver.backend, tokens), expected, rtol=1e-4, atol=1e-4
    )

    driver.fit()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    exported = Qwen3ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    with torch.no_grad():
        got = exported(tokens).logits
    reloaded = build_driver(RECIPE, [  # the checkpoint's own Megatron model
        "--model-config", str(hf_dir), "--init-from", str(checkpoint),
        "--run-dir", str(tmp_path / "ref"),
    ])  # fmt: skip
    trained = megatron_outputs(reloaded.backend, tokens)
    torch.testing.assert_close(got, trained, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, expected, atol=1e-3)  # trained: not the start any more
