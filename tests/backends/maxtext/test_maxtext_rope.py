"""Llama 3.1 ``rope_scaling`` on MaxText: its ``llama3.1`` rope (Llama 3.1's scaling
values built in, adjacent pairs rotated), the query and key kernels reordered from
Hugging Face's rotated halves. One MaxText run (imports take 20-40 s): ``--init-from`` a
tiny Llama with Llama 3.1's scaling starts from the ``transformers`` model's loss, and
its export loads back in ``transformers`` with the run's next loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from baton.core.errors import UsageError
from support.recording import Losses
from support.tiny_llama import LLAMA31_ROPE, hf_loss, load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
SEQ, BATCH = 256, 2
#: large weights and positions past 2,048 wavelengths: Llama 3.1's scaling shows in the loss
SHAPE = {"initializer_range": 0.3, "max_position_embeddings": 16384, "rope_theta": 500000.0}


def test_mapping_reorders_rotary_halves_to_pairs_and_back_bit_for_bit(tmp_path):
    pytest.importorskip("transformers")
    import numpy as np
    from safetensors.numpy import load_file

    from baton.backends.maxtext.hf import hf_to_maxtext, maxtext_to_hf
    from baton.core.model.spec import LlamaSpec

    hf_dir = save_tiny_llama(tmp_path / "hf", rope_scaling=LLAMA31_ROPE, **SHAPE)
    spec = LlamaSpec.from_hf(hf_dir)
    weights = load_file(str(hf_dir / "model.safetensors"))
    params = hf_to_maxtext(weights, spec)["params"]
    back = maxtext_to_hf(params, spec)
    assert sorted(back) == sorted(weights)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)
    key = params["decoder"]["layers"]["self_attention"]["key"]["kernel"][:, 0]  # [emb, kv, hd]
    hf_key = weights["model.layers.0.self_attn.k_proj.weight"].T.reshape(key.shape)
    assert np.array_equal(key[..., 0::2], hf_key[..., :8])  # first half: even positions
    assert np.array_equal(key[..., 1::2], hf_key[..., 8:])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"factor": 32.0}, r"factor=32.0.*factor=8.0"),
        ({"original_max_position_embeddings": 32}, "original_max_position_embeddings=32"),
    ],
)
def test_scaling_values_maxtext_fixes_are_refused_by_name(change, named):
    from baton.backends.maxtext.hf import maxtext_settings
    from baton.core.model.spec import LlamaSpec, RopeScaling

    scaling = {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_type"} | change
    spec = LlamaSpec(512, 64, 2, 4, 2, 176, 16, rope_scaling=RopeScaling(**scaling))
    with pytest.raises(UsageError, match=named):
        maxtext_settings(spec)
    plain = maxtext_settings(LlamaSpec(512, 64, 2, 4, 2, 176, 16))
    assert plain["rope_type"] == "default"


def test_init_from_llama31_scaling_first_loss_equals_transformers_and_export(tmp_path):
    """fp32; saved after step 1: the export's loss on the second batch is step 2's."""
    pytest.importorskip("maxtext")
    import torch

    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus
    from baton.core.cli.recipe import build_driver
    from baton.core.model.spec import LlamaSpec
    from baton.tools.export import main as export_main

    def batch(index: int) -> Any:
        batches = TextBatches(TextCorpus.load(None).train, batch_size=BATCH, seq_len=SEQ)
        batches.skip_to(index)
        item = next(batches)
        return (torch.from_numpy(item[k]).long() for k in ("inputs", "targets"))

    hf_dir = save_tiny_llama(tmp_path / "hf", rope_scaling=LLAMA31_ROPE, **SHAPE)
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "1",
        "--no-async-save", "--log-every", "1", "--eval-every", "0",
        "--batch-size", str(BATCH), "--seq-len", str(SEQ),
        "--run-dir", str(tmp_path / "run"), "--no-progress", "--overrides", "dtype=float32",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    tokens, targets = batch(0)
    expected = hf_loss(load_llama(hf_dir), tokens, targets)
    assert record.values[1] == pytest.approx(expected, rel=1e-4)
    plain = save_tiny_llama(tmp_path / "plain", **SHAPE)
    assert hf_loss(load_llama(plain), tokens, targets) != pytest.approx(expected, rel=1e-3)

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    assert LlamaSpec.from_hf(tmp_path / "out") == LlamaSpec.from_hf(hf_dir)
    tokens, targets = batch(1)
    exported = hf_loss(load_llama(tmp_path / "out"), tokens, targets)
    assert record.values[2] == pytest.approx(exported, rel=1e-4)
