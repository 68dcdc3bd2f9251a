"""A :class:`~baton.core.model.spec.LlamaSpec` built by TorchTitan, and Hugging Face
weights into it.

The spec becomes a flavour of TorchTitan's own llama3 model registry
(``torchtitan.models.llama3.llama3_configs``), made of TorchTitan's public config
pieces (``make_gqa_config``, ``make_ffn_config``, ``RMSNorm``, ``ComplexRoPE`` with its
``llama`` scaling for a Llama 3.1-style ``rope_scaling``), so the
model, its parallelization, pipelining and its state-dict adapter are TorchTitan's.
Hugging Face weights load through TorchTitan's initial-load path
(``checkpoint.initial_load_in_hf``), i.e. ``Llama3StateDictAdapter.from_hf``.

Example::

    from baton.backends.torchtitan.configs import llama3_debug
    from baton.backends.torchtitan.hf import use_spec, init_from_hf

    config = llama3_debug(steps=20)
    use_spec(config, LlamaSpec.from_hf("tiny-llama/"))   # flavour llama3/baton-<digest>
    init_from_hf(config, "tiny-llama/")                  # weights, step 0, fresh optimizer
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from typing import Any

from baton.core.model.spec import LlamaSpec

#: prefix of the flavours this module registers in TorchTitan's llama3 registry
FLAVOR_PREFIX = "baton-"


#: the model families (Hugging Face ``model_type``) built here: a Llama as a flavour of
#: TorchTitan's llama3 registry, a Qwen3 and a Qwen3-MoE of its qwen3 registry
FAMILIES = frozenset({"llama", "qwen3", "qwen3_moe"})
#: the families TorchTitan's qwen3 model builds
QWEN3_FAMILIES = frozenset({"qwen3", "qwen3_moe"})


def flavor_name(spec: LlamaSpec) -> str:
    """A stable flavour name for ``spec``: the same spec always gets the same name."""
    digest = hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()
    return FLAVOR_PREFIX + digest[:12]


def model_config(spec: LlamaSpec, attn_backend: str = "flex", **_: Any) -> Any:
    """TorchTitan's ``Llama3Model.Config`` for ``spec`` (the signature of a registry entry)."""
    import torch.nn as nn
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import (
        get_attention_config,
        make_ffn_config,
        make_gqa_config,
    )
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    dim = spec.hidden_size
    linear = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    ones = {"weight": nn.init.ones_}
    rope = ComplexRoPE.Config(
        dim=spec.head_dim, max_seq_len=spec.max_seq_len, theta=spec.rope_theta, **rope_scaling(spec)
    )

    def norm() -> Any:
        return RMSNorm.Config(normalized_shape=dim, eps=spec.norm_eps, param_init=ones)

    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=norm(),
            ffn_norm=norm(),
            attention=make_gqa_config(
                dim=dim,
                n_heads=spec.num_heads,
                n_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                wqkv_param_init=linear,
                wo_param_init=linear,
                inner_attention=get_attention_config(attn_backend),
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=dim,
                hidden_dim=spec.ffn_hidden_size,
                w1_param_init=linear,
                w2w3_param_init=linear,
            ),
        )
        for _ in range(spec.num_layers)
    ]
    return Llama3Model.Config(
        dim=dim,
        vocab_size=spec.vocab_size,
        enable_weight_tying=spec.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=spec.vocab_size,
            embedding_dim=dim,
            param_init={"weight": partial(nn.init.normal_, std=0.02)},
        ),
        norm=norm(),
        lm_head=Linear.Config(in_features=dim, out_features=spec.vocab_size, param_init=linear),
        layers=layers,
    )


def rope_scaling(spec: LlamaSpec) -> dict[str, Any]:
    """TorchTitan's ``RoPE.Config`` scaling fields for ``spec``: its ``llama`` scaling
    takes every Llama 3.1-style value (factor, both frequency factors, original length)."""
    scaling = spec.rope_scaling
    if scaling is None:
        return {"scaling": "none"}
    return {
        "scaling": "llama",
        "scaling_factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_max_position_embeddings,
    }


def register(spec: LlamaSpec) -> str:
    """Register ``spec`` as a flavour of TorchTitan's model registry of its family
    (llama3 or qwen3); returns its name (that registry's ``model_registry(name)`` then
    builds TorchTitan's ``ModelSpec`` for it). A family it cannot build yet is a
    ``UsageError`` naming it."""
    spec.require_family(FAMILIES, backend="torchtitan")
    name = flavor_name(spec)
    if spec.family in QWEN3_FAMILIES:
        from torchtitan.models.qwen3 import qwen3_configs

        from baton.backends.torchtitan.qwen3 import qwen3_model_config

        qwen3_configs.setdefault(name, partial(qwen3_model_config, spec))
    else:
        from torchtitan.models.llama3 import llama3_configs

        llama3_configs.setdefault(name, partial(model_config, spec))
    return name


def registry(spec: LlamaSpec) -> Any:
    """The ``model_registry`` function of TorchTitan's model for ``spec``'s family."""
    if spec.family in QWEN3_FAMILIES:
        from torchtitan.models.qwen3 import model_registry
    else:
        from torchtitan.models.llama3 import model_registry
    return model_registry


def use_spec(config: Any, spec: LlamaSpec) -> Any:
    """Make a ``Trainer.Config`` train ``spec``: the model and the loss's vocabulary."""
    config.model_spec = registry(spec)(register(spec))
    config.loss.loss_fn.global_vocab_size = spec.vocab_size
    return config


def init_from_hf(config: Any, hf_dir: str) -> Any:
    """Start from a Hugging Face directory's weights through TorchTitan's own HF load
    (``Llama3StateDictAdapter.from_hf``): weights only, step 0, fresh optimizer."""
    config.checkpoint.initial_load_path = hf_dir
    config.checkpoint.initial_load_in_hf = True
    config.checkpoint.initial_load_model_only = True
    return config


def tokenizer_vocab(tokenizer: str) -> int:
    """The number of ids of a local Hugging Face tokenizer directory, as TorchTitan's
    ``HuggingFaceTokenizer`` counts them."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from baton.backends.torchtitan.chat_template import generation_tags_allowed

    with generation_tags_allowed():
        return HuggingFaceTokenizer(tokenizer_path=tokenizer).get_vocab_size()


def set_vocab(config: Any, vocab_size: int) -> Any:
    """Resize the vocabulary everywhere TorchTitan's llama3 config holds it (the model,
    the embedding, the output layer, the loss), keeping every other dimension."""
    model = config.model_spec.model
    model.vocab_size = vocab_size
    model.tok_embeddings.num_embeddings = vocab_size
    model.lm_head.out_features = vocab_size
    config.loss.loss_fn.global_vocab_size = vocab_size
    return config


def vocab_mismatch(config: Any) -> str | None:
    """Where a ``Trainer.Config``'s vocabulary sizes disagree (say after ``--set
    model_spec.model.vocab_size=N``), described for an error message; ``None`` if they
    agree or the model is not a decoder with these fields."""
    model = config.model_spec.model
    try:
        sizes = {
            "model_spec.model.vocab_size": model.vocab_size,
            "model_spec.model.tok_embeddings.num_embeddings": model.tok_embeddings.num_embeddings,
            "model_spec.model.lm_head.out_features": model.lm_head.out_features,
        }
    except AttributeError:
        return None
    loss_vocab = getattr(getattr(config.loss, "loss_fn", None), "global_vocab_size", None)
    if loss_vocab is not None:
        sizes["loss.loss_fn.global_vocab_size"] = loss_vocab
    if len(set(sizes.values())) == 1:
        return None
    return ", ".join(f"{name}={size}" for name, size in sizes.items())
