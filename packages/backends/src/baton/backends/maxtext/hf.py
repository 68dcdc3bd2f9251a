"""A :class:`~baton.core.model.spec.ModelSpec` as MaxText config keys, and Hugging Face
Llama, Qwen3 and Qwen3-MoE weights into MaxText's parameter layout (and back).

A Qwen3 is MaxText's ``qwen3`` / ``qwen3_moe`` decoder block
(:mod:`baton.backends.maxtext.qwen3`: QK norm, experts); a Llama is ``llama2``:
MaxText builds the model (``decoder_block: llama2``, SwiGLU ``mlp_activations``, RMSNorm,
rotary positions of the default type, which rotate halves as Hugging Face does).
MaxText's own converters (``maxtext.checkpoint_conversion``) target its named model
configs (their hooks reorder rotary dimensions for ``llama3.1`` rope), so the mapping for
the default rope is written here: kernels transposed to ``[in, ...out]``, the query kernel
divided by ``sqrt(head_dim)`` (MaxText folds the attention scale into it), layers stacked
on axis 1 (``scan_layers``). The weights are written with MaxText's
``save_params_to_path`` and loaded through ``load_parameters_path`` (weights only).

A Llama 3.1-style ``rope_scaling`` is MaxText's ``rope_type: llama3.1`` (its
``LLaMARotaryEmbedding``), whose scaling values are Llama 3.1's constants
(:data:`FIXED_ROPE_SCALING`; others are refused naming them) and which rotates adjacent
pairs: the query and key kernels' head dimensions are then reordered as MaxText's own
``llama3.1`` converter does (Hugging Face's first half to even positions, second half to
odd ones).

Example::

    settings |= maxtext_settings(spec)                  # MaxText config keys
    items = write_params("tiny-llama/", "runs/x/hf-params")
    settings["load_parameters_path"] = str(items)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.hf_io import read_safetensors
from baton.backends.maxtext.qwen3 import experts_to_hf, experts_to_maxtext, qwen3_settings
from baton.core.model.spec import LlamaSpec

#: the Llama 3.1 rotary scaling MaxText's ``llama3.1`` rope fixes (all of its values)
FIXED_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def rope_settings(spec: LlamaSpec) -> dict[str, Any]:
    """MaxText's rotary keys for ``spec``: the default rope, or ``llama3.1`` for Llama 3.1's
    scaling (any other scaling is a ``UsageError`` naming its values)."""
    if spec.rope_scaling is None:
        return {"rope_type": "default", "rope_max_timescale": spec.rope_theta}
    spec.rope_scaling.refuse_unless(FIXED_ROPE_SCALING, backend="MaxText")
    return {"rope_type": "llama3.1", "rope_use_scale": True, "rope_max_timescale": spec.rope_theta}


def interleaves_rope(spec: LlamaSpec) -> bool:
    """Whether MaxText rotates adjacent pairs for ``spec`` (its ``llama3.1`` rope), so the
    query and key kernels' head dimensions are reordered from Hugging Face's halves."""
    return spec.rope_scaling is not None


def halves_to_pairs(kernel: np.ndarray) -> np.ndarray:
    """Reorder the last (head) dimension from rotated halves (Hugging Face) to rotated
    adjacent pairs: ``[x0..x(h/2-1), y0..]`` -> ``[x0, y0, x1, y1, ...]``."""
    *rest, head_dim = kernel.shape
    halves = kernel.reshape(*rest, 2, head_dim // 2)
    return np.swapaxes(halves, -1, -2).reshape(*rest, head_dim)


def pairs_to_halves(kernel: np.ndarray) -> np.ndarray:
    """The inverse of :func:`halves_to_pairs` (MaxText's own ``llama3.1`` export order)."""
    return np.concatenate([kernel[..., ::2], kernel[..., 1::2]], axis=-1)


#: MaxText's dense MLP kernels and the Hugging Face projection of each
DENSE_MLP = {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}

#: the model families (Hugging Face ``model_type``) built here
FAMILIES = frozenset({"llama", "qwen3", "qwen3_moe"})


def maxtext_settings(spec: LlamaSpec) -> dict[str, Any]:
    """MaxText config keys that build ``spec``; a family they cannot build yet is a
    ``UsageError`` naming it."""
    spec.require_family(FAMILIES, backend="maxtext")
    family = qwen3_settings(spec) if spec.qk_norm else {"decoder_block": "llama2"}
    shape = {
        "base_emb_dim": spec.hidden_size,
        "base_num_query_heads": spec.num_heads,
        "base_num_kv_heads": spec.num_kv_heads,
        "base_mlp_dim": spec.ffn_hidden_size,
        "base_num_decoder_layers": spec.num_layers,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "mlp_activations": ["silu", "linear"],
        "normalization_layer_epsilon": spec.norm_eps,
        "logits_via_embedding": spec.tie_embeddings,
        "normalize_embedding_logits": False,
        "enable_dropout": False,
        "scan_layers": True,
        "fused_qkv": False,
        "fused_mlp": False,
    }
    return rope_settings(spec) | shape | family  # a Qwen3-MoE's base_mlp_dim: its experts'


def hf_to_maxtext(hf: dict[str, np.ndarray], spec: LlamaSpec) -> dict[str, Any]:
    """MaxText's (scanned) parameter tree ``{"params": {...}}`` from HF tensors."""
    emb, hd = spec.hidden_size, spec.head_dim

    def stack(name: str, convert: Any) -> np.ndarray:
        layers = [convert(hf[name.format(i)]) for i in range(spec.num_layers)]
        return np.stack(layers, axis=1)  # MaxText's param_scan_axis

    pairs = interleaves_rope(spec)
    # MaxText's llama2 block folds the attention scale into the query kernel; qwen3
    # scales in the layer (query_pre_attn_scalar)
    query_scale = 1.0 if spec.qk_norm else 1 / math.sqrt(hd)

    def heads(count: int, scale: float = 1.0, rotated: bool = False) -> Any:
        def convert(w: np.ndarray) -> np.ndarray:
            kernel = (w.T * scale).reshape(emb, count, hd)
            return halves_to_pairs(kernel) if rotated and pairs else kernel

        return convert

    layer = "model.layers.{}."
    layers = {
        "self_attention": {
            "query": {"kernel": stack(layer + "self_attn.q_proj.weight",
                                      heads(spec.num_heads, query_scale, rotated=True))},
            "key": {"kernel": stack(layer + "self_attn.k_proj.weight",
                                    heads(spec.num_kv_heads, rotated=True))},
            "value": {"kernel": stack(layer + "self_attn.v_proj.weight",
                                      heads(spec.num_kv_heads))},
            "out": {"kernel": stack(layer + "self_attn.o_proj.weight",
                                    lambda w: w.T.reshape(spec.num_heads, hd, emb))},
        },
        "pre_self_attention_layer_norm": {
            "scale": stack(layer + "input_layernorm.weight", lambda w: w)
        },
        "post_self_attention_layer_norm": {
            "scale": stack(layer + "post_attention_layernorm.weight", lambda w: w)
        },
    }  # fmt: skip
    if spec.qk_norm:
        attention = layers["self_attention"]
        attention["query_norm"] = {"scale": stack(layer + "self_attn.q_norm.weight", np.asarray)}
        attention["key_norm"] = {"scale": stack(layer + "self_attn.k_norm.weight", np.asarray)}
    if spec.moe is not None:
        layers["moe_block"] = experts_to_maxtext(hf, spec)
    else:
        layers["mlp"] = {
            name: {"kernel": stack(layer + f"mlp.{projection}.weight", lambda w: w.T)}
            for name, projection in DENSE_MLP.items()
        }
    decoder: dict[str, Any] = {"layers": layers, "decoder_norm": {"scale": hf["model.norm.weight"]}}
    if not spec.tie_embeddings:
        decoder["logits_dense"] = {"kernel": hf["lm_head.weight"].T}
    tree = {"token_embedder": {"embedding": hf["model.embed_tokens.weight"]}, "decoder": decoder}
    return {"params": _contiguous(tree)}


def _contiguous(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _contiguous(value) for key, value in tree.items()}
    return np.ascontiguousarray(tree, dtype=np.float32)


def write_params(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """Convert a ``save_pretrained`` directory into a MaxText parameter checkpoint under
    ``out_dir``; returns the path for ``load_parameters_path``."""
    from maxtext.common.checkpointing import save_params_to_path

    spec = LlamaSpec.from_hf(hf_dir)
    spec.require_family(FAMILIES, backend="maxtext")
    weights = read_safetensors(hf_dir, framework="numpy")
    out = Path(out_dir).resolve()
    save_params_to_path(str(out), hf_to_maxtext(weights, spec))
    return out / "items"


def write_params_apart(hf_dir: str | Path, out_dir: str | Path) -> Path:
    """:func:`write_params` in a child process, so that this one's JAX stays unstarted
    (MaxText's writer starts it; a run that simulates host devices must start it
    itself)."""
    import subprocess
    import sys

    code = "import sys; from baton.backends.maxtext.hf import write_params as w; w(*sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, str(hf_dir), str(out_dir)], check=True)
    return Path(out_dir).resolve() / "items"


def maxtext_to_hf(params: dict[str, Any], spec: LlamaSpec) -> dict[str, np.ndarray]:
    """Hugging Face tensors (``LlamaForCausalLM``, ``Qwen3ForCausalLM`` or
    ``Qwen3MoeForCausalLM``) from MaxText's (scanned) ``params`` tree (the inner
    collection: ``{"decoder": ..., "token_embedder": ...}``)."""
    emb, hd = spec.hidden_size, spec.head_dim
    decoder = params["decoder"]
    layers = decoder["layers"]
    attention = layers["self_attention"]
    query_scale = 1.0 if spec.qk_norm else math.sqrt(hd)
    out = {
        "model.embed_tokens.weight": params["token_embedder"]["embedding"],
        "model.norm.weight": decoder["decoder_norm"]["scale"],
    }
    if not spec.tie_embeddings:
        out["lm_head.weight"] = decoder["logits_dense"]["kernel"].T
    pairs = interleaves_rope(spec)

    def rotated(kernel: Any) -> Any:
        return pairs_to_halves(np.asarray(kernel)) if pairs else kernel

    for i in range(spec.num_layers):
        name = f"model.layers.{i}."
        query = rotated(attention["query"]["kernel"][:, i]) * query_scale
        out[name + "self_attn.q_proj.weight"] = query.reshape(emb, -1).T
        key = rotated(attention["key"]["kernel"][:, i])
        out[name + "self_attn.k_proj.weight"] = key.reshape(emb, -1).T
        value = attention["value"]["kernel"][:, i]
        out[name + "self_attn.v_proj.weight"] = value.reshape(emb, -1).T
        out[name + "self_attn.o_proj.weight"] = attention["out"]["kernel"][:, i].reshape(-1, emb).T
        if spec.qk_norm:
            out[name + "self_attn.q_norm.weight"] = attention["query_norm"]["scale"][:, i]
            out[name + "self_attn.k_norm.weight"] = attention["key_norm"]["scale"][:, i]
        if spec.moe is None:
            for key, projection in DENSE_MLP.items():
                out[name + f"mlp.{projection}.weight"] = layers["mlp"][key]["kernel"][:, i].T
        norm = layers["pre_self_attention_layer_norm"]["scale"][:, i]
        out[name + "input_layernorm.weight"] = norm
        norm = layers["post_self_attention_layer_norm"]["scale"][:, i]
        out[name + "post_attention_layernorm.weight"] = norm
    if spec.moe is not None:
        out |= experts_to_hf(layers["moe_block"], spec)
    return {key: np.ascontiguousarray(value, dtype=np.float32) for key, value in out.items()}
