"""MaxText's parameter arrays seen as named tensors: Hugging Face names for a Llama or a
dense Qwen3 (``decoder_block: llama2`` or ``qwen3``, the layouts ``hf.hf_to_maxtext``
writes), MaxText's own dotted paths for any other model.

A scanned MaxText model keeps each kernel of every layer in one array stacked on axis
1 (``param_scan_axis``). A ``View`` names one layer's part of it as Hugging Face lays it
out: layer ``i``'s slice, reshaped and transposed to ``[out, in]``, the query kernel
multiplied back by ``sqrt(head_dim)`` (MaxText folds the attention scale into it) and,
for the ``llama3.1`` rope, the query and key head dimensions reordered from adjacent
pairs back to halves (``hf.pairs_to_halves``). Values and gradients are computed from
the stacked arrays by JAX (arrays are immutable: a view is a lazily computed slice), a
gradient with the inverse scale (the chain rule through ``W_maxtext = W_hf.T / c``);
``View.put`` writes a Hugging Face tensor back with ``.at[:, i].set``.

Example::

    views = model_views(hparams, params)          # params: MaxText's pure param dict
    q0 = views["model.layers.0.self_attn.q_proj.weight"]
    q0.value(params).shape                         # (heads * head_dim, hidden)
    params = q0.put(params, q0.value(params) * 0)  # a new params dict
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: MaxText stacks scanned layers on this axis of every layer kernel (``param_scan_axis``)
LAYER_AXIS = 1

Path = tuple[str, ...]


def get_leaf(params: Mapping[str, Any], path: Path) -> Any:
    node: Any = params
    for key in path:
        node = node[key]
    return node


def set_leaf(params: Mapping[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of the nested dict ``params`` with ``value`` at ``path`` (others shared)."""
    head, *rest = path
    copied = dict(params)
    copied[head] = set_leaf(params[head], tuple(rest), value) if rest else value
    return copied


def leaves(params: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """Every array of a nested dict by its path."""
    found: dict[Path, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            found |= leaves(value, (*prefix, str(key)))
        else:
            found[(*prefix, str(key))] = value
    return found


@dataclass(frozen=True)
class View:
    """One named tensor: all of MaxText's array at ``path`` or layer ``layer`` of it.

    ``to_named`` maps the MaxText slice to the named layout (a reshape/transpose/
    permutation), ``from_named`` back; the named value is ``scale * to_named(slice)``.
    """

    name: str
    path: Path
    layer: int | None
    to_named: Callable[[Any], Any]
    from_named: Callable[[Any], Any]
    scale: float = 1.0
    #: the stacked array's dotted MaxText path when ``layer`` is set (``Piece.fused``)
    fused: str | None = None

    def _slice(self, array: Any) -> Any:
        return array if self.layer is None else array[:, self.layer]

    def value(self, params: Mapping[str, Any]) -> Any:
        named = self.to_named(self._slice(get_leaf(params, self.path)))
        return named * self.scale if self.scale != 1.0 else named

    def gradient(self, grads: Mapping[str, Any]) -> Any:
        """The gradient with respect to the named tensor, from MaxText's gradient tree."""
        named = self.to_named(self._slice(get_leaf(grads, self.path)))
        return named / self.scale if self.scale != 1.0 else named

    def put(self, params: Mapping[str, Any], value: Any) -> dict[str, Any]:
        """``params`` with this tensor replaced by ``value`` (in the named layout)."""
        array = get_leaf(params, self.path)
        native = self.from_named(value / self.scale if self.scale != 1.0 else value)
        native = native.astype(array.dtype)
        updated = native if self.layer is None else array.at[:, self.layer].set(native)
        return set_leaf(params, self.path, updated)


def _identity(x: Any) -> Any:
    return x


def _transpose(x: Any) -> Any:
    return x.T


def _pairs_to_halves(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.concatenate([x[..., ::2], x[..., 1::2]], axis=-1)


def _halves_to_pairs(x: Any) -> Any:
    import jax.numpy as jnp

    *rest, head_dim = x.shape
    return jnp.swapaxes(x.reshape(*rest, 2, head_dim // 2), -1, -2).reshape(*rest, head_dim)


def _heads_in(heads: int, head_dim: int, rotated: bool) -> tuple[Callable, Callable]:
    """[in, heads, head_dim] <-> [heads * head_dim, in] (q, k, v projections)."""

    def to_named(x: Any) -> Any:
        x = _pairs_to_halves(x) if rotated else x
        return x.reshape(x.shape[0], heads * head_dim).T

    def from_named(y: Any) -> Any:
        x = y.T.reshape(y.shape[1], heads, head_dim)
        return _halves_to_pairs(x) if rotated else x

    return to_named, from_named


def _heads_out(heads: int, head_dim: int) -> tuple[Callable, Callable]:
    """[heads, head_dim, out] <-> [out, heads * head_dim] (the output projection)."""

    def to_named(x: Any) -> Any:
        return x.reshape(heads * head_dim, x.shape[-1]).T

    def from_named(y: Any) -> Any:
        return y.T.reshape(heads, head_dim, y.shape[0])

    return to_named, from_named


#: MaxText decoder blocks whose scanned layers ``hf_views`` names as Hugging Face's
HF_BLOCKS = ("llama2", "qwen3")


def _decoder_block(hparams: Any) -> str:
    return str(getattr(hparams.decoder_block, "value", hparams.decoder_block))


def hf_layer_views(hparams: Any, params: Mapping[str, Any]) -> dict[str, View]:
    """Hugging Face names of a scanned MaxText Llama or dense Qwen3 (``hf.hf_to_maxtext``'s
    layout): a Qwen3 adds each layer's query and key norms, and its query kernel is
    unscaled."""
    qwen3 = _decoder_block(hparams) == "qwen3"
    heads, kv_heads = int(hparams.num_query_heads), int(hparams.num_kv_heads)
    head_dim = int(hparams.head_dim)
    rotated = str(getattr(hparams.rope_type, "value", hparams.rope_type)).startswith("llama3")
    layer = ("decoder", "layers")
    attention, mlp = (*layer, "self_attention"), (*layer, "mlp")
    q = _heads_in(heads, head_dim, rotated)
    k = _heads_in(kv_heads, head_dim, rotated)
    v = _heads_in(kv_heads, head_dim, False)
    o = _heads_out(heads, head_dim)
    linear = (_transpose, _transpose)
    per_layer: list[tuple[str, Path, tuple[Callable, Callable], float]] = [
        ("self_attn.q_proj.weight", (*attention, "query", "kernel"), q,
         1.0 if qwen3 else math.sqrt(head_dim)),
        ("self_attn.k_proj.weight", (*attention, "key", "kernel"), k, 1.0),
        ("self_attn.v_proj.weight", (*attention, "value", "kernel"), v, 1.0),
        ("self_attn.o_proj.weight", (*attention, "out", "kernel"), o, 1.0),
        ("mlp.gate_proj.weight", (*mlp, "wi_0", "kernel"), linear, 1.0),
        ("mlp.up_proj.weight", (*mlp, "wi_1", "kernel"), linear, 1.0),
        ("mlp.down_proj.weight", (*mlp, "wo", "kernel"), linear, 1.0),
        ("input_layernorm.weight", (*layer, "pre_self_attention_layer_norm", "scale"),
         (_identity, _identity), 1.0),
        ("post_attention_layernorm.weight", (*layer, "post_self_attention_layer_norm", "scale"),
         (_identity, _identity), 1.0),
    ]  # fmt: skip
    if qwen3:
        per_layer += [
            ("self_attn.q_norm.weight", (*attention, "query_norm", "scale"),
             (_identity, _identity), 1.0),
            ("self_attn.k_norm.weight", (*attention, "key_norm", "scale"),
             (_identity, _identity), 1.0),
        ]  # fmt: skip
    views: dict[str, View] = {}

    def add(name: str, path: Path, pair: tuple[Callable, Callable], layer: int | None = None,
            scale: float = 1.0) -> None:  # fmt: skip
        fused = ".".join(path) if layer is not None else None
        views[name] = View(name, path, layer, pair[0], pair[1], scale, fused)

    add("model.embed_tokens.weight", ("token_embedder", "embedding"), (_identity, _identity))
    for i in range(int(hparams.num_decoder_layers)):
        for suffix, path, pair, scale in per_layer:
            add(f"model.layers.{i}.{suffix}", path, pair, i, scale)
    add("model.norm.weight", ("decoder", "decoder_norm", "scale"), (_identity, _identity))
    if ("decoder", "logits_dense", "kernel") in leaves(params):
        add("lm_head.weight", ("decoder", "logits_dense", "kernel"), linear)
    return views


def has_hf_layout(hparams: Any, params: Mapping[str, Any]) -> bool:
    """Whether ``params`` is the scanned Llama or dense Qwen3 ``hf.hf_to_maxtext`` writes
    (no more, no less: a Qwen3-MoE's experts are not named)."""
    if _decoder_block(hparams) not in HF_BLOCKS:
        return False
    if not hparams.scan_layers or hparams.fused_qkv or hparams.fused_mlp:
        return False
    named = {view.path for view in hf_layer_views(hparams, params).values()}
    return named == set(leaves(params))


def own_views(params: Mapping[str, Any]) -> dict[str, View]:
    """MaxText's own names (dotted paths), each array whole."""
    return {
        ".".join(path): View(".".join(path), path, None, _identity, _identity)
        for path in leaves(params)
    }


def model_views(hparams: Any, params: Mapping[str, Any]) -> dict[str, View]:
    """The named tensors of a MaxText model: Hugging Face names for a Llama or a dense
    Qwen3, else MaxText's."""
    if has_hf_layout(hparams, params):
        return hf_layer_views(hparams, params)
    return own_views(params)
