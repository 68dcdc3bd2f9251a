"""One model, Megatron-Core: a Hugging Face Llama built as a Megatron ``GPTModel``
(RMSNorm, SwiGLU, RoPE, GQA, local layer spec), its weights loaded by baton's mapping,
trained through baton, exported back to a directory ``transformers`` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

import torch

from baton.core.recipe import build_driver
from support.tiny_llama import load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
VOCAB = 512


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))


def _megatron_logits(backend: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of the backend's (single-stage) GPTModel, causal attention, eval mode."""
    model = backend.chunks[0].module.eval()
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    mask = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool), 1)
    with torch.no_grad():
        return model(tokens, positions, mask[None, None])


@pytest.mark.parametrize("tie", [False, True])
def test_init_from_hf_logits_equal_transformers(tmp_path, tie):
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB, tie=tie)
    driver = build_driver(RECIPE, ["--init-from", str(hf_dir), "--run-dir", str(tmp_path / "r")])
    assert driver.settings["model_spec"]["tie_embeddings"] is tie
    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    backend = driver.backend
    try:
        backend.setup()
        got = _megatron_logits(backend, _tokens())
    finally:
        backend.teardown()
        recorder.undo()
    with torch.no_grad():
        expected = load_llama(hf_dir)(_tokens()).logits
    assert got.shape == expected.shape == (2, 32, VOCAB)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_mapping_round_trips_bit_for_bit(tmp_path):
    from baton.backends.megatron.hf import hf_to_megatron, megatron_to_hf, read_hf_weights
    from baton.core.model_spec import LlamaSpec

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB)
    spec = LlamaSpec.from_hf(hf_dir)
    weights = read_hf_weights(str(hf_dir))
    back = megatron_to_hf(hf_to_megatron(weights, spec), spec)
    assert sorted(back) == sorted(weights)
    assert all(torch.equal(back[k], weights[k]) for k in weights)
