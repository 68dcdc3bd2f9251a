"""Llama 3.x ``rope_scaling`` on Megatron-Core: its ``GPTModel`` scales rotary frequencies
by ``rope_scaling_factor`` with Llama 3.1's other values built in. ``--init-from`` a tiny
Llama with Llama 3.2's scaling (factor 32) computes the ``transformers`` model's logits;
a scaling Megatron-Core cannot express is refused by name before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import torch

from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.megatron_model import megatron_outputs
from support.tiny_llama import LLAMA31_ROPE, SHORT_CONTEXT_ROPE, load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
VOCAB, SEQ = 512, 64
#: Llama 3.2 1B/3B's rope_scaling: Llama 3.1's with a factor of 32
LLAMA32_ROPE = {**LLAMA31_ROPE, "factor": 32.0}


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def test_init_from_llama32_scaling_logits_equal_transformers(tmp_path):
    shape = {"initializer_range": 0.3, "max_position_embeddings": 16384}
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB, rope_scaling=LLAMA32_ROPE, **shape)
    argv = ["--init-from", str(hf_dir), "--seq-len", str(SEQ), "--run-dir", str(tmp_path / "r")]
    backend = build_driver(RECIPE, argv).backend
    assert (backend.config.rope_scaling, backend.config.rope_scaling_factor) == (True, 32.0)
    tokens = _tokens()
    got = megatron_outputs(backend, tokens)
    with torch.no_grad():
        expected = load_llama(hf_dir)(tokens).logits
        plain = save_tiny_llama(tmp_path / "plain", vocab_size=VOCAB, **shape)
        unscaled = load_llama(plain)(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(unscaled, expected, rtol=1e-2, atol=1e-2)  # scaling shows


def test_scaling_values_megatron_fixes_are_refused_by_name(tmp_path):
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=VOCAB, rope_scaling=SHORT_CONTEXT_ROPE)
    with pytest.raises(UsageError, match=r"original_max_position_embeddings=32.*8192"):
        build_driver(RECIPE, ["--model-config", str(hf_dir), "--run-dir", str(tmp_path / "r")])


def test_a_fine_tuning_lr_below_the_default_floor_just_works(tmp_path):
    """--min-lr defaults to --lr / 10; a floor above the peak is one clear line, not
    Megatron-Core's scheduler assert."""
    from baton.backends.megatron.build import build_optimizer

    config = build_driver(RECIPE, ["--lr", "1e-4", "--run-dir", str(tmp_path / "r")]).backend.config
    assert (config.optimizer.lr, config.optimizer.min_lr) == (1e-4, 1e-5)
    config.optimizer.min_lr = 1e-3
    with pytest.raises(UsageError, match=r"min_lr \(0.001\) must be between 0 and .*lr \(0.0001\)"):
        build_optimizer(config, [])
    assert not (tmp_path / "r").exists()
