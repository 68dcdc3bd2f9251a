"""A TorchTitan model built in the test process as a baton run builds it on CPU.

model = sdpa_model(qwen3_model_config(spec), weights)   # eval mode, weights loaded
logits = model(tokens)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def sdpa_model(config: Any, weights: Mapping[str, torch.Tensor] | None = None) -> Any:
    """``config`` built with SDPA attention in place of FlexAttention (what the
    ``torchtitan_cpu_attention`` patch does on CPU), TorchTitan's initialisation (its
    buffers, such as the RoPE table, as the trainer has them), then ``weights`` loaded;
    in eval mode."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    for _fqn, _cfg, parent, attr in list(config.traverse(FlexAttention.Config)):
        if parent is not None:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    model = config.build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
        if weights is not None:
            model.load_state_dict(weights)
    return model.eval()
