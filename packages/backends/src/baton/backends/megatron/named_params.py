"""This rank's Megatron-Core parameters by name, with their layout: the entries
(``baton.backends.torch_pieces.Entry``) a ``MegatronModelState`` shows as ``Piece``s.

Names: a model built from the shared Llama spec (``config.spec`` set by ``hf.use_spec``)
uses the Hugging Face names; ``linear_qkv`` is shown as its ``q_proj``/``k_proj``/
``v_proj`` parts and ``linear_fc1`` as ``gate_proj``/``up_proj``, each a view into the
fused tensor (``fused`` names it: its parts freeze together). Any other model uses
Megatron's own names with global layer numbers (``decoder.layers.3.mlp.linear_fc2.weight``;
a gated ``linear_fc1`` as its halves ``...linear_fc1.weight.gate`` / ``.up``).

Shapes: ``q_proj``, ``k_proj`` and ``v_proj`` are shown per key/value group, shaped
``(num_query_groups, heads_per_group x head_dim, hidden)`` (``head_dim`` rows for k and v),
because Megatron interleaves the groups' q, k and v rows: no 2-D view of the fused tensor
has the Hugging Face shape. Their row-major ``reshape(-1, hidden)`` is the Hugging Face
tensor. Every other tensor has its Hugging Face (or Megatron) shape; the embedding and
output layer have Megatron's padded vocabulary rows.

Layout: a tensor-parallel shard's ``index`` is its slice along Megatron's
``partition_dim``; a pipeline stage holds its layers (global numbers); ``counted`` is true
on tensor-parallel rank 0 for replicated tensors (norms), on data-parallel (and context)
rank 0, and false for the last stage's copy of a tied embedding (Megatron's ``shared``).

Example::

    entries = named_entries(backend.chunks, spec=backend.config.spec)
    [entry.name for entry in entries][:2]   # ['model.embed_tokens.weight', 'model.layers.0...']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from baton.backends.megatron.hf import LAYER_NAMES, QK_NORM_NAMES, global_name, gpt_model
from baton.backends.megatron.moe import global_expert_name, hf_expert_name
from baton.backends.torch_pieces import Entry, View

#: Megatron global name -> Hugging Face name, outside the layers
_OUTER_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_LAYER_HF = {mg.format("{}"): hf for hf, mg in {**LAYER_NAMES, **QK_NORM_NAMES}.items()}


@dataclass(frozen=True)
class _Layout:
    tp_rank: int
    tp_size: int
    replica_zero: bool  # data-parallel (and context-parallel) rank 0
    expert_replica_zero: bool  # expert-data-parallel rank 0 (the experts' replicas)


def named_entries(chunks: list[Any], spec: Any = None) -> list[Entry]:
    """Every parameter of this rank's model chunks as named entries (fused tensors as
    their parts), in the chunks' order."""
    from megatron.core import parallel_state

    layout = _Layout(
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        replica_zero=parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0,
        expert_replica_zero=parallel_state.get_expert_data_parallel_rank() == 0,
    )
    entries: list[Entry] = []
    for chunk in chunks:
        module = gpt_model(chunk)
        numbers = [layer.layer_number - 1 for layer in module.decoder.layers]
        config = module.config
        for local, param in module.named_parameters():
            megatron = global_expert_name(global_name(local, numbers), config.num_moe_experts)
            entries.extend(_entries(megatron, param, config, layout, spec))
    return entries


def _entries(name: str, param: Any, config: Any, layout: _Layout, spec: Any) -> list[Entry]:
    partitioned = bool(getattr(param, "tensor_model_parallel", False))
    counted = (
        (layout.expert_replica_zero if ".local_experts." in name else layout.replica_zero)
        and (partitioned or layout.tp_rank == 0)
        and not getattr(param, "shared", False)
    )
    parts = 1 if not partitioned else layout.tp_size
    if name.endswith("self_attention.linear_qkv.weight") and spec is not None:
        return _qkv_parts(name, param, config, layout, counted)
    if name.endswith("linear_fc1.weight") and config.gated_linear_unit:  # dense or an expert
        return _fc1_parts(name, param, layout, counted, hf=spec is not None)
    dim = int(getattr(param, "partition_dim", 0)) if partitioned else 0
    shape = list(param.shape)
    shape[dim] *= parts
    index = [slice(0, extent) for extent in param.shape]
    rank = layout.tp_rank if partitioned else 0
    index[dim] = slice(rank * param.shape[dim], (rank + 1) * param.shape[dim])
    if name == "output_layer.weight" and getattr(param, "shared", False):
        name = "embedding.word_embeddings.weight"  # the last stage's tied copy
    shown = _hf_name(name) if spec is not None else name
    return [Entry(shown, param, tuple(shape), tuple(index), counted)]


def _hf_name(name: str) -> str:
    """The Hugging Face name of a global Megatron name (``decoder.layers.3.x``)."""
    if name in _OUTER_NAMES:
        return _OUTER_NAMES[name]
    expert = hf_expert_name(name)
    if expert is not None:
        return expert
    parts = name.split(".")
    key = "decoder.layers.{}." + ".".join(parts[3:])
    if parts[:2] != ["decoder", "layers"] or key not in _LAYER_HF:
        raise KeyError(f"no Hugging Face name for Megatron's {name}")
    return _LAYER_HF[key].format(parts[2])


def _rows(start: int, stop: int, shape: tuple[int, ...]) -> View:
    """A view of rows ``start:stop`` of a tensor reshaped to ``shape``."""

    def view(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(shape)[:, start:stop] if len(shape) == 3 else tensor[start:stop]

    return view


def _qkv_parts(name: str, param: Any, config: Any, layout: _Layout, counted: bool) -> list[Entry]:
    """``q_proj``, ``k_proj``, ``v_proj`` as per-group views of ``linear_qkv``."""
    groups = config.num_query_groups or config.num_attention_heads
    per_group = config.num_attention_heads // groups
    head_dim = config.kv_channels
    hidden = param.shape[1]
    local_groups = groups // layout.tp_size
    shape = (local_groups, (per_group + 2) * head_dim, hidden)
    first = slice(layout.tp_rank * local_groups, (layout.tp_rank + 1) * local_groups)
    layer = name.split(".")[2]
    bounds = {
        "q_proj": (0, per_group * head_dim),
        "k_proj": (per_group * head_dim, (per_group + 1) * head_dim),
        "v_proj": ((per_group + 1) * head_dim, (per_group + 2) * head_dim),
    }
    return [
        Entry(
            f"model.layers.{layer}.self_attn.{part}.weight",
            param,
            (groups, stop - start, hidden),
            (first, slice(0, stop - start), slice(0, hidden)),
            counted,
            fused=name,
            view=_rows(start, stop, shape),
        )
        for part, (start, stop) in bounds.items()
    ]


def _fc1_parts(name: str, param: Any, layout: _Layout, counted: bool, *, hf: bool) -> list[Entry]:
    """Gate and up halves of a gated ``linear_fc1`` (each split over tensor-parallel
    ranks on its own, as ``hf.local_shard`` loads them)."""
    local = param.shape[0] // 2
    hidden = param.shape[1]
    layer = name.split(".")[2]
    index = (slice(layout.tp_rank * local, (layout.tp_rank + 1) * local), slice(0, hidden))
    shape = (local * layout.tp_size, hidden)
    mlp = f"model.layers.{layer}.mlp."
    expert = re.search(r"\.local_experts\.(\d+)\.", name)
    if expert is not None:  # one of a MoE layer's experts
        mlp += f"experts.{expert.group(1)}."
    names = (
        [f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"] if hf else [f"{name}.gate", f"{name}.up"]
    )
    views = [_rows(0, local, tuple(param.shape)), _rows(local, 2 * local, tuple(param.shape))]
    return [
        Entry(shown, param, shape, index, counted, fused=name, view=view)
        for shown, view in zip(names, views, strict=True)
    ]
