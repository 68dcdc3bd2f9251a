"""Llama 3.1-style ``rope_scaling`` on TorchTitan: ``--init-from`` a tiny Hugging Face
Llama whose scaling changes most of its rotary frequencies (a 32-position original
context) trains TorchTitan's ``llama`` scaled RoPE: the first loss is the ``transformers``
model's, and the export writes the same scaling back."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")


from baton.core.cli.recipe import build_driver
from support.recording import Losses
from support.tiny_llama import SHORT_CONTEXT_ROPE, hf_loss, load_llama, save_tiny_llama
from support.titan_batches import first_byte_batch

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH, VOCAB = 64, 2, 512


def test_init_from_scaled_rope_first_loss_equals_transformers_and_exports_it(tmp_path):
    from baton.core.model.spec import LlamaSpec
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_llama(
        tmp_path / "hf", vocab_size=VOCAB, rope_scaling=SHORT_CONTEXT_ROPE, initializer_range=0.3
    )
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "1", "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--log-every", "1", "--save-every", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    tokens, labels = first_byte_batch(SEQ, BATCH)
    expected = hf_loss(load_llama(hf_dir), tokens, labels)
    assert record.values[1] == pytest.approx(expected, rel=1e-4)
    # the scaling matters here: the same weights with plain rotary positions differ
    plain = save_tiny_llama(tmp_path / "plain", vocab_size=VOCAB, initializer_range=0.3)
    assert hf_loss(load_llama(plain), tokens, labels) != pytest.approx(expected, rel=1e-2)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    assert LlamaSpec.from_hf(tmp_path / "out") == LlamaSpec.from_hf(hf_dir)
    assert load_llama(tmp_path / "out").config.rope_parameters["rope_type"] == "llama3"
