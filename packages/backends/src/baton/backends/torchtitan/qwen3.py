"""A Qwen3 or Qwen3-MoE :class:`~baton.core.model.spec.ModelSpec` as TorchTitan's own
``qwen3`` model: ``Qwen3Model`` made of TorchTitan's public config pieces
(``make_gqa_config`` with per-head RMSNorm on queries and keys, ``make_ffn_config`` or,
on a Qwen3-MoE's sparse layers, TorchTitan's ``MoE`` (``torchtitan/moe.py``),
``CosSinRoPE``, Hugging Face's rotate-half rotary), registered as a flavour of
``torchtitan.models.qwen3``, so
its parallelization and its state-dict adapter (``Qwen3StateDictAdapter``, which reads
and writes Hugging Face's names) are TorchTitan's.

Example::

    config = qwen3_model_config(ModelSpec.from_hf("tiny-qwen3/"))   # Qwen3Model.Config
    model = config.build()
"""

from __future__ import annotations

from functools import partial
from typing import Any

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec


def _init(std: float = 0.02) -> dict[str, Any]:
    """TorchTitan's parameter initialisers of a linear layer (normal weight, zero bias)."""
    import torch.nn as nn

    return {"weight": partial(nn.init.normal_, std=std), "bias": nn.init.zeros_}


def _norm(spec: ModelSpec, width: int) -> Any:
    """An RMSNorm over ``width`` with the spec's epsilon, initialised to ones."""
    import torch.nn as nn
    from torchtitan.models.common import RMSNorm

    return RMSNorm.Config(
        normalized_shape=width, eps=spec.norm_eps, param_init={"weight": nn.init.ones_}
    )


def _block(spec: ModelSpec, attn_backend: str, layer: int) -> Any:
    """Transformer block ``layer`` of a Qwen3: grouped-query attention with per-head
    RMSNorm on queries and keys (fused QKV, cos/sin rotary), then a SwiGLU feed-forward
    or, on a sparse layer of a Qwen3-MoE, TorchTitan's ``MoE`` (``torchtitan/moe.py``)."""
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.common.config_utils import (
        get_attention_config,
        make_gqa_config,
    )
    from torchtitan.models.qwen3.model import Qwen3TransformerBlock

    dim = spec.hidden_size
    rope = CosSinRoPE.Config(dim=spec.head_dim, max_seq_len=spec.max_seq_len, theta=spec.rope_theta)
    return Qwen3TransformerBlock.Config(
        attention_norm=_norm(spec, dim),
        ffn_norm=_norm(spec, dim),
        attention=make_gqa_config(
            dim=dim,
            n_heads=spec.num_heads,
            n_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            wqkv_param_init=_init(),
            wo_param_init=_init(),
            inner_attention=get_attention_config(attn_backend),
            fuse_qkv=True,
            rope=rope,
            qk_norm=_norm(spec, spec.head_dim),
        ),
        **_mlp(spec, layer),
    )


def _mlp(spec: ModelSpec, layer: int) -> dict[str, Any]:
    """The block's MLP field: ``moe`` on a sparse layer, else ``feed_forward``."""
    if spec.moe is not None and spec.moe.is_sparse(layer):
        from baton.backends.torchtitan.moe import expert_init, moe_config

        return {"moe": moe_config(spec, _init(), expert_init())}
    from torchtitan.models.common.config_utils import make_ffn_config

    feed_forward = make_ffn_config(
        dim=spec.hidden_size,
        hidden_dim=spec.ffn_hidden_size,
        w1_param_init=_init(),
        w2w3_param_init=_init(),
    )
    return {"feed_forward": feed_forward}


def qwen3_model_config(spec: ModelSpec, attn_backend: str = "flex", **_: Any) -> Any:
    """TorchTitan's ``Qwen3Model.Config`` for a Qwen3 or Qwen3-MoE ``spec`` (the signature
    of a registry entry). A rotary scaling is refused: TorchTitan's cos/sin rotary has none."""
    if spec.rope_scaling is not None:
        raise UsageError(
            "torchtitan cannot build a Qwen3 with rope_scaling (its cos/sin rotary has no "
            "llama3 scaling); remove rope_scaling or train it with recipes/hf_finetune.py"
        )
    import torch.nn as nn
    from torchtitan.models.common import Embedding, Linear
    from torchtitan.models.qwen3 import Qwen3Model

    from baton.backends.torchtitan.moe import warn_unapplied

    warn_unapplied(spec)

    dim = spec.hidden_size
    return Qwen3Model.Config(
        dim=dim,
        vocab_size=spec.vocab_size,
        enable_weight_tying=spec.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=spec.vocab_size,
            embedding_dim=dim,
            param_init={"weight": partial(nn.init.normal_, std=0.02)},
        ),
        norm=_norm(spec, dim),
        lm_head=Linear.Config(in_features=dim, out_features=spec.vocab_size, param_init=_init()),
        layers=[_block(spec, attn_backend, layer) for layer in range(spec.num_layers)],
    )
