"""A tiny Hugging Face Qwen3 and Qwen3-MoE built locally (no hub), as ``save_pretrained``
writes them (a Qwen3-MoE's experts as one tensor per expert and projection).

    dense = save_tiny_qwen3(tmp_path / "qwen3")
    moe = save_tiny_qwen3(tmp_path / "qwen3-moe", moe=True)   # 4 experts, top 2
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: a Qwen3 shape small enough for CPU tests: GQA, QK norm, head_dim (32) above
#: hidden_size / heads (16)
TINY_QWEN3 = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}
#: the experts of the tiny Qwen3-MoE: 4 experts, top 2, renormalised top-k weights
TINY_EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.01,
}


def save_tiny_qwen3(
    directory: Path, *, moe: bool = False, vocab_size: int = 256, seed: int = 0, **shape: Any
) -> Path:
    """Write a randomly initialised fp32 ``Qwen3ForCausalLM`` (``moe``:
    ``Qwen3MoeForCausalLM``) with ``save_pretrained``."""
    import torch
    import transformers

    fields = {**TINY_QWEN3, **(TINY_EXPERTS if moe else {}), **shape}
    torch.manual_seed(seed)
    if moe:
        config = transformers.Qwen3MoeConfig(vocab_size=vocab_size, **fields)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(vocab_size=vocab_size, **fields)
        )
    model.float().save_pretrained(directory)
    return directory
