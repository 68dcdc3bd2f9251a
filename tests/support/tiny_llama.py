"""A tiny Hugging Face Llama built locally (no hub): the model every backend's
``--init-from`` and export tests start from and compare against.

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512)
    scaled = save_tiny_llama(tmp_path / "scaled", rope_scaling=SHORT_CONTEXT_ROPE)
    model = load_llama(hf_dir)                   # LlamaForCausalLM, fp32, eval mode
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

#: a Llama shape small enough for CPU tests: GQA (4 query heads over 2 KV heads), SwiGLU
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}
#: Llama 3.1's own ``rope_scaling`` (every backend builds it); with 8,192 original positions
#: it changes only a 16-wide head's lowest frequencies: pass ``max_position_embeddings``
#: above 8,192 and weights large enough (``initializer_range=0.3``) for it to show
LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
#: llama3 scaling of a 32-position original context: most frequencies of the tiny model
#: change (TorchTitan and Fabric build any llama3 values; Megatron-Core and MaxText do not)
SHORT_CONTEXT_ROPE = {**LLAMA31_ROPE, "original_max_position_embeddings": 32}


def save_tiny_llama(
    directory: Path, *, vocab_size: int = 512, tie: bool = False, seed: int = 0, **shape: Any
) -> Path:
    """Write a randomly initialised fp32 ``LlamaForCausalLM`` with ``save_pretrained``."""
    import torch
    import transformers

    fields = copy.deepcopy({**TINY_SHAPE, **shape})  # transformers edits rope_scaling in place
    config = transformers.LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=tie, **fields)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float()
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def load_llama(directory: Path) -> Any:
    """``LlamaForCausalLM.from_pretrained(directory)`` in fp32, eval mode."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
    return model.eval()


def hf_loss(model: Any, tokens: Any, labels: Any) -> float:
    """Mean next-token cross entropy of ``model`` on ``tokens`` against ``labels``."""
    import torch

    with torch.no_grad():
        logits = model(tokens).logits
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()))
