"""The ``model_state`` and ``gradients`` abilities on TorchTitan: the shared
``TorchModelState`` over ``trainer.model_parts``, its ``OptimizersContainer`` and
``LRSchedulersContainer``.

Names: the Hugging Face names, through the model's own state-dict adapter
(``Llama3StateDictAdapter.from_hf_map``, the mapping ``--init-from`` and ``baton export``
use): ``layers.0.attention.qkv_linear.wq.weight`` is ``model.layers.0.self_attn.q_proj.weight``.
A parameter the adapter does not map (a model without an adapter) keeps TorchTitan's
name, and so does a mixture-of-experts layer's grouped expert weight
(``layers.0.moe.routed_experts.inner_experts.w1_EFD``: one tensor for Hugging Face's
``model.layers.0.mlp.experts.<e>.gate_proj.weight`` of every expert). The fused QKV projection of a model built from the spec (``FusedQKVLinear.wqkv``) is
shown as ``q_proj``, ``k_proj`` and ``v_proj``, views shaped by KV group whose elements
read row-major are Hugging Face's (``qkv_parts``: TorchTitan's grouping and its rotary
row order undone by strides). A model with separate ``wq``/``wk`` (no spec) keeps
TorchTitan's rotary row order within each head under the Hugging Face name (norms and
sums are the same; ``baton export`` applies the adapter's permutation).

Layouts: FSDP and TP shards are DTensors (``torch_pieces.layout``); under pipeline
parallelism each rank shows its stage's layers; a replicated plain tensor is counted on
the first rank of its stage.

Gradients and freezing: TorchTitan's ``train_step`` clips with
``torchtitan.distributed.utils.clip_grad_norm_``, which ``capture.StepCapture`` already
wraps for each step; the wrapper calls ``before_clipping`` first once this state exists
(frozen gradients dropped, watchers shown the rest), so clipping, weight decay and the
optimizer skip frozen parameters.

Learning rate: ``set_hyperparameter("lr", x)`` sets each group's rate and scales its
``LambdaLR``'s ``base_lrs`` (warmup, decay and floor keep their shape, from ``x``); the
logged ``lr`` of the next step is ``x``. TorchTitan's scheduler checkpoint keeps only the
step, so after a resume the rates come from the config again: a callback that set one
sets it again on resume (its own state).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import Entry, entries_from_parameters, strip_wrappers


def hf_renamer(adapter: Any) -> Callable[[str], str]:
    """TorchTitan name -> Hugging Face name through ``adapter.from_hf_map`` (unmapped
    names are kept).

    >>> class Adapter:
    ...     from_hf_map = {"model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight"}
    >>> hf_renamer(Adapter())("layers.3.feed_forward.w3.weight")
    'model.layers.3.mlp.up_proj.weight'
    """
    mapping = getattr(adapter, "from_hf_map", None) or {}
    to_hf = {titan: hf for hf, titan in mapping.items() if titan is not None}

    def rename(name: str) -> str:
        abstract = re.sub(r"(\d+)", "{}", name, count=1)
        found = re.search(r"\d+", name)
        hf = to_hf.get(abstract)
        if hf is None or hf.count("{}") > 1:  # grouped experts: one tensor, many HF names
            return name
        return hf.format(found.group(0)) if found and "{}" in hf else hf

    return rename


def _first_of_stage(trainer: Any) -> bool:
    """Whether this rank is the first of the ranks holding its pipeline stage."""
    meshes = trainer.parallel_dims.get_all_one_dimensional_meshes()
    return all(mesh.get_local_rank() == 0 for name, mesh in meshes.items() if "pp" not in name)


def titan_entries(trainer: Any) -> list[Entry]:
    """The entries of every model part this rank holds, under Hugging Face names."""
    adapter = getattr(trainer.checkpointer, "sd_adapter", None)
    to_hf = hf_renamer(adapter)
    replica_counted = _first_of_stage(trainer)
    entries: list[Entry] = []
    for part in trainer.model_parts:
        fused = _fused_qkv(part)
        named = part.named_parameters()
        for entry in entries_from_parameters(named, rename=lambda n: to_hf(strip_wrappers(n))):
            if not _is_dtensor(entry.parameter):  # whole on every rank of its stage
                entry = replace(entry, counted=replica_counted)
            if id(entry.parameter) in fused:
                entries += qkv_parts(entry, *fused[id(entry.parameter)], to_hf)
            else:
                entries.append(entry)
    return entries


def _fused_qkv(part: Any) -> dict[int, tuple[int, int]]:
    """``id(wqkv weight or bias) -> (q heads per KV head, head_dim)`` of every fused QKV
    projection (``FusedQKVLinear``) in ``part``."""
    from torchtitan.models.common.attention import FusedQKVLinear

    fused: dict[int, tuple[int, int]] = {}
    for module in part.modules():
        if isinstance(module, FusedQKVLinear):
            for parameter in module.wqkv.parameters():
                fused[id(parameter)] = (module.heads_per_kv, module.head_dim)
    return fused


def _whole_kv_groups(entry: Entry, group_rows: int) -> slice:
    """The KV groups of ``entry``'s rows this rank holds (each ``group_rows`` rows of the
    fused ``wqkv``); a shard that splits a group is refused, naming the fix."""
    rows = entry.index[0]
    if rows.start % group_rows or (rows.stop % group_rows and rows.stop != rows.start):
        raise ValueError(
            f"model_state: this rank holds rows {rows.start}:{rows.stop} of {entry.name}, "
            f"which splits a KV group of {group_rows} rows; use a data or tensor parallel "
            "degree that divides the number of KV heads"
        )
    return slice(rows.start // group_rows, rows.stop // group_rows)


def _qkv_views(
    heads_per_kv: int, head_dim: int
) -> tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]]:
    """The query, key and value views of a fused ``wqkv`` tensor (or a shard of whole KV
    groups): its rows grouped by KV head, and the query and key rows' rotary order
    undone by strides (``qkv_parts``)."""
    half = head_dim // 2

    def grouped(t: Any) -> Any:
        return t.view(-1, heads_per_kv + 2, head_dim, *t.shape[1:])

    def q_view(t: Any) -> Any:
        return grouped(t)[:, :heads_per_kv].unflatten(2, (half, 2)).transpose(2, 3)

    def k_view(t: Any) -> Any:
        return grouped(t)[:, heads_per_kv].unflatten(1, (half, 2)).transpose(1, 2)

    def v_view(t: Any) -> Any:
        return grouped(t)[:, heads_per_kv + 1]

    return q_view, k_view, v_view


def qkv_parts(
    entry: Entry, heads_per_kv: int, head_dim: int, to_hf: Callable[[str], str]
) -> list[Entry]:
    """The Hugging Face ``q_proj``, ``k_proj``, ``v_proj`` parts of a fused ``wqkv``, as
    views whose elements, read row-major, are Hugging Face's.

    TorchTitan stacks the rows by KV group, ``[n_kv, q heads per KV + 2, head_dim, ...]``
    (the group's query heads, then its key head, then its value head), and orders each
    query and key head's rows for its complex rotary embedding (row ``2j + i`` is Hugging
    Face's row ``i * head_dim / 2 + j``). The parts are shaped so that both are undone by
    strides alone:

    - ``q_proj``: ``[n_kv, q heads per KV, 2, head_dim / 2, ...]``
    - ``k_proj``: ``[n_kv, 2, head_dim / 2, ...]``
    - ``v_proj``: ``[n_kv, head_dim, ...]``

    ``reshape(hf_shape)`` of a whole part is the Hugging Face tensor. A shard must hold
    whole KV groups (FSDP and TP split the rows by group when their degree divides the
    number of KV heads; another split is refused)."""
    group_rows = (heads_per_kv + 2) * head_dim
    groups = _whole_kv_groups(entry, group_rows)
    n_kv = entry.global_shape[0] // group_rows
    tail_shape, tail_index = entry.global_shape[1:], entry.index[1:]
    half = head_dim // 2
    base = entry.name.removesuffix(".wqkv.weight").removesuffix(".wqkv.bias")
    param = entry.name.rsplit(".", 1)[1]
    q_view, k_view, v_view = _qkv_views(heads_per_kv, head_dim)
    every = (slice(0, 2), slice(0, half))
    parts = (
        ("q", q_view, (n_kv, heads_per_kv, 2, half), (groups, slice(0, heads_per_kv), *every)),
        ("k", k_view, (n_kv, 2, half), (groups, *every)),
        ("v", v_view, (n_kv, head_dim), (groups, slice(0, head_dim))),
    )
    return [
        Entry(
            to_hf(f"{base}.w{letter}.{param}"),
            entry.parameter,
            (*lead, *tail_shape),
            (*lead_index, *tail_index),
            counted=entry.counted,
            fused=entry.name,
            view=view,
        )
        for letter, view, lead, lead_index in parts
    ]


def _is_dtensor(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def titan_model_state(trainer: Any, fetch: Callable[..., dict[str, float]]) -> TorchModelState:
    """The ``ModelState`` of a built TorchTitan ``Trainer``."""
    return TorchModelState(
        titan_entries(trainer),
        optimizers=list(trainer.optimizers.optimizers),
        schedulers=list(trainer.lr_schedulers.schedulers),
        fetch=fetch,
    )
