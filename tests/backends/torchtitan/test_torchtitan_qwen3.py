"""One model, TorchTitan: a dense Hugging Face Qwen3 (QK norm, head_dim above hidden /
heads) built by TorchTitan's own qwen3 model and loaded through its own
``Qwen3StateDictAdapter``: logits equal ``transformers``' and ``--init-from`` starts the
run from exactly that function."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("transformers")

import torch

from baton.core.cli.recipe import build_driver
from baton.core.model.spec import ModelSpec
from support.recording import Losses
from support.tiny_llama import hf_loss
from support.tiny_qwen3 import save_tiny_qwen3
from support.titan_batches import first_byte_batch
from support.titan_model import sdpa_model

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH, VOCAB = 64, 2, 512


def test_qwen3_logits_equal_transformers_and_init_from_starts_there(tmp_path):
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
    from transformers import Qwen3ForCausalLM

    from baton.backends.hf_io import read_safetensors
    from baton.backends.torchtitan.export import dcp_folder, read_model_weights
    from baton.backends.torchtitan.qwen3 import qwen3_model_config
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_qwen3(tmp_path / "hf", vocab_size=VOCAB)
    reference = Qwen3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    spec = ModelSpec.from_hf(hf_dir)
    config = qwen3_model_config(spec)
    weights = Qwen3StateDictAdapter(config, None).from_hf(read_safetensors(hf_dir))
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    model = sdpa_model(config, weights)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=1e-4, atol=1e-4)

    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "1", "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--log-every", "1", "--save-every", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    assert driver.backend.config.model_spec.name == "qwen3"
    assert driver.options.settings["model_spec"]["family"] == "qwen3"
    inputs, labels = first_byte_batch(SEQ, BATCH)
    assert record.values[1] == pytest.approx(hf_loss(reference, inputs, labels), rel=1e-4)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    assert ModelSpec.from_hf(tmp_path / "out") == spec
    exported = Qwen3ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    trained = Qwen3StateDictAdapter(config, None).to_hf(read_model_weights(dcp_folder(checkpoint)))
    with torch.no_grad():
        model.load_state_dict(Qwen3StateDictAdapter(config, None).from_hf(trained))
        torch.testing.assert_close(exported(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)
