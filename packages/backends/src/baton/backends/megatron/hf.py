"""A :class:`~baton.core.model.spec.LlamaSpec` as a Megatron-Core ``GPTModel``, and
Hugging Face Llama weights in and out of it.

The architecture is built by Megatron-Core itself (``TransformerConfig`` with RMSNorm,
a SwiGLU MLP, rotary positions, grouped-query attention, no biases; the local or
Transformer Engine layer spec). Megatron Bridge (NVIDIA's converter) needs Transformer
Engine and a GPU, so the weight mapping is written here, once per direction:

- ``linear_qkv``: per query group, that group's query heads, then its key, then its value;
- ``linear_fc1``: the gate projection stacked over the up projection;
- layer norms: ``input_layernorm`` / ``pre_mlp_layernorm`` (fused into ``linear_qkv`` /
  ``linear_fc1`` as ``layer_norm_weight`` under Transformer Engine).

Megatron's rotary embedding rotates halves, as Hugging Face's does: no permutation.
A Llama 3.1-style ``rope_scaling`` is Megatron's own ``rope_scaling`` with
``rope_scaling_factor``; its other values are constants there (:data:`FIXED_ROPE_SCALING`),
so a spec with others is refused naming them.

Example::

    from baton.backends.megatron.hf import hf_to_megatron, megatron_to_hf, transformer_fields

    spec = LlamaSpec.from_hf("tiny-llama/")
    tiny_transformer_config(**transformer_fields(spec))    # Megatron's TransformerConfig
    full = hf_to_megatron(hf_state_dict, spec)            # global Megatron names
    hf = megatron_to_hf(full, spec)                        # and back, bit for bit
"""

from __future__ import annotations

import re
from typing import Any

import torch

from baton.backends.hf_io import read_safetensors
from baton.backends.megatron.moe import (
    experts_to_hf,
    experts_to_megatron,
    global_expert_name,
    is_sparse,
    moe_fields,
)
from baton.core.model.spec import LlamaSpec

#: Hugging Face name -> Megatron name, per layer (``{}`` is the layer index)
LAYER_NAMES = {
    "model.layers.{}.input_layernorm.weight": "decoder.layers.{}.input_layernorm.weight",
    "model.layers.{}.self_attn.o_proj.weight": "decoder.layers.{}.self_attention.linear_proj.weight",
    "model.layers.{}.post_attention_layernorm.weight": "decoder.layers.{}.pre_mlp_layernorm.weight",
    "model.layers.{}.mlp.down_proj.weight": "decoder.layers.{}.mlp.linear_fc2.weight",
}
#: Megatron names of Transformer Engine's fused layer norms -> the local spec's names
TE_NORMS = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
#: tensor-parallel layers split along their input dimension (the rest along the output)
ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")
#: the Llama 3.1 rotary scaling values Megatron-Core's ``RotaryEmbedding`` fixes
FIXED_ROPE_SCALING = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


#: the model families (Hugging Face ``model_type``) built here (a Qwen3: QK layer norm;
#: a Qwen3-MoE: Megatron's MoE layers, ``moe.py``)
FAMILIES = frozenset({"llama", "qwen3", "qwen3_moe"})
#: a Qwen3's per-head query and key norms, Hugging Face's names -> Megatron's
QK_NORM_NAMES = {
    "model.layers.{}.self_attn.q_norm.weight": "decoder.layers.{}.self_attention.q_layernorm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "decoder.layers.{}.self_attention.k_layernorm.weight",
}


def transformer_fields(spec: LlamaSpec) -> dict[str, Any]:
    """``TransformerConfig`` fields that build ``spec``: the shape, RMSNorm, SwiGLU,
    grouped-query attention, no biases. A family it cannot build yet is a
    ``UsageError`` naming it."""
    import torch.nn.functional as F

    spec.require_family(FAMILIES, backend="megatron")

    return dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        ffn_hidden_size=spec.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        bias_activation_fusion=False,
        qk_layernorm=spec.qk_norm,
        **moe_fields(spec),
    )


def use_spec(config: Any, spec: LlamaSpec) -> Any:
    """Set a ``MegatronConfig``'s model-level fields for ``spec`` (its ``model`` is built
    from :func:`transformer_fields`): vocabulary, RoPE and its scaling, tying. A rotary
    scaling Megatron-Core cannot build is a ``UsageError`` naming its values."""
    spec.require_family(FAMILIES, backend="megatron")
    scaling = spec.rope_scaling
    if scaling is not None:
        scaling.refuse_unless(FIXED_ROPE_SCALING, backend="Megatron-Core")
    config.rope_scaling = scaling is not None
    config.rope_scaling_factor = scaling.factor if scaling is not None else 8.0
    config.vocab_size = spec.vocab_size
    config.make_vocab_size_divisible_by = 1  # no padded rows: the logits are the model's
    config.position_embedding_type = "rope"
    config.rotary_base = spec.rope_theta
    config.share_embeddings_and_output_weights = spec.tie_embeddings
    config.spec = spec
    return config


def layer_names(spec: LlamaSpec, layer: int) -> dict[str, str]:
    """The tensors of ``layer`` copied as they are (Hugging Face name -> Megatron name;
    a MoE layer's experts are mapped by ``moe.py``)."""
    names = {**LAYER_NAMES, **(QK_NORM_NAMES if spec.qk_norm else {})}
    if is_sparse(spec, layer):
        return {hf: mg for hf, mg in names.items() if ".mlp." not in hf}
    return names


def hf_to_megatron(hf: dict[str, torch.Tensor], spec: LlamaSpec) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron ``GPTModel`` tensors, by global layer index."""
    group = spec.num_heads // spec.num_kv_heads
    hd, hidden = spec.head_dim, spec.hidden_size
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
    }
    # tied: the last pipeline stage keeps its own copy of the embedding as output layer
    out["output_layer.weight"] = hf["model.embed_tokens.weight" if spec.tie_embeddings
                                    else "lm_head.weight"]  # fmt: skip
    for i in range(spec.num_layers):
        for hf_name, mg_name in layer_names(spec, i).items():
            out[mg_name.format(i)] = hf[hf_name.format(i)]
        attn = f"model.layers.{i}.self_attn."
        q = hf[attn + "q_proj.weight"].reshape(spec.num_kv_heads, group * hd, hidden)
        k = hf[attn + "k_proj.weight"].reshape(spec.num_kv_heads, hd, hidden)
        v = hf[attn + "v_proj.weight"].reshape(spec.num_kv_heads, hd, hidden)
        qkv = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        out[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = qkv
        if is_sparse(spec, i):
            out.update(experts_to_megatron(hf, spec, i))
            continue
        mlp = f"model.layers.{i}.mlp."
        fc1 = torch.cat([hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]], dim=0)
        out[f"decoder.layers.{i}.mlp.linear_fc1.weight"] = fc1
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], spec: LlamaSpec) -> dict[str, torch.Tensor]:
    """Hugging Face ``LlamaForCausalLM`` (``Qwen3ForCausalLM``) tensors from full
    Megatron tensors."""
    group = spec.num_heads // spec.num_kv_heads
    hd, hidden = spec.head_dim, spec.hidden_size
    out = {
        "model.embed_tokens.weight": mg["embedding.word_embeddings.weight"],
        "model.norm.weight": mg["decoder.final_layernorm.weight"],
    }
    if not spec.tie_embeddings:
        out["lm_head.weight"] = mg["output_layer.weight"]
    for i in range(spec.num_layers):
        for hf_name, mg_name in layer_names(spec, i).items():
            out[hf_name.format(i)] = mg[mg_name.format(i)]
        qkv = mg[f"decoder.layers.{i}.self_attention.linear_qkv.weight"]
        q, k, v = qkv.reshape(spec.num_kv_heads, (group + 2) * hd, hidden).split(
            [group * hd, hd, hd], dim=1
        )
        attn = f"model.layers.{i}.self_attn."
        out[attn + "q_proj.weight"] = q.reshape(-1, hidden)
        out[attn + "k_proj.weight"] = k.reshape(-1, hidden)
        out[attn + "v_proj.weight"] = v.reshape(-1, hidden)
        if is_sparse(spec, i):
            out.update(experts_to_hf(mg, spec, i))
            continue
        gate, up = mg[f"decoder.layers.{i}.mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[f"model.layers.{i}.mlp.gate_proj.weight"] = gate
        out[f"model.layers.{i}.mlp.up_proj.weight"] = up
    return {name: tensor.contiguous() for name, tensor in out.items()}


def local_shard(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's part of a full tensor (``size`` ranks)."""
    if size == 1 or full.dim() == 1 or name.endswith("router.weight"):  # replicated
        return full
    if name.endswith("linear_fc1.weight"):  # gate and up are split separately
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    dim = 1 if name.endswith(ROW_PARALLEL) else 0
    return full.chunk(size, dim=dim)[rank]


def gpt_model(chunk: Any) -> Any:
    """The ``GPTModel`` inside a model chunk: Megatron's DDP wraps it, and in bf16/fp16
    a ``Float16Module`` too (each keeps what it wraps as ``.module``)."""
    while not hasattr(chunk, "decoder"):
        chunk = chunk.module
    return chunk


def load_full_weights(chunks: list[Any], full: dict[str, torch.Tensor]) -> None:
    """Copy full Megatron tensors into this rank's model chunks (DDP-wrapped or not):
    each chunk's layers by their global number, each tensor's tensor-parallel part."""
    from megatron.core import parallel_state as ps

    dense = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    experts = ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    for chunk in chunks:
        module = gpt_model(chunk)
        numbers = [layer.layer_number - 1 for layer in module.decoder.layers]
        for name, param in module.state_dict(keep_vars=True).items():
            if name.endswith("_extra_state") or not isinstance(param, torch.Tensor):
                continue
            source = global_expert_name(global_name(name, numbers), module.config.num_moe_experts)
            if source not in full:
                raise KeyError(f"no Hugging Face weight maps to Megatron's {name} ({source})")
            rank, size = experts if ".local_experts." in name else dense
            with torch.no_grad():
                param.copy_(local_shard(name, full[source], rank, size))


def global_name(local: str, numbers: list[int]) -> str:
    """``decoder.layers.<local>.x`` -> ``decoder.layers.<global>.x``, fused norms unfused."""
    match = re.match(r"decoder\.layers\.(\d+)\.(.*)", local)
    if match is None:
        return local
    rest = TE_NORMS.get(match.group(2), match.group(2))
    return f"decoder.layers.{numbers[int(match.group(1))]}.{rest}"


def load_hf(chunks: list[Any], hf_dir: str) -> None:
    """Load a Hugging Face Llama directory's weights into this rank's model chunks."""
    spec = LlamaSpec.from_hf(hf_dir)
    spec.require_family(FAMILIES, backend="megatron")
    load_full_weights(chunks, hf_to_megatron(read_safetensors(hf_dir), spec))
