"""A Qwen3-MoE's experts as Megatron-Core MoE layers, and their Hugging Face weights in
and out.

Megatron builds the experts itself (``TransformerConfig.num_moe_experts``: a
``TopKRouter``, a token dispatcher and a ``SequentialMLP`` of SwiGLU experts in the local
layer spec); :func:`moe_fields` sets the config from the spec's :class:`MoeSpec`:

- Qwen3-MoE's router is a softmax over all experts, then the top k. Renormalised
  (``norm_topk_prob``) that equals Megatron's default router (top k of the logits, then a
  softmax over those k); without renormalisation it is ``moe_router_pre_softmax`` (softmax,
  then top k, weights kept as they are).
- The load-balancing loss is Megatron's ``aux_loss`` (Switch Transformer's, per micro-batch
  and per layer) times ``router_aux_loss_coef``; its formula differs from ``transformers'``
  (docs/one-model.md, "Megatron-Core and Qwen3-MoE").
- Dense layers (``mlp_only_layers``, ``decoder_sparse_step``) are ``moe_layer_freq``, one
  0 or 1 per layer.
- The token dispatcher is ``allgather`` (Megatron's default): ``alltoall`` copies its
  split sizes to the host on a CUDA stream and needs a GPU. The router runs in fp32.

Weights, per MoE layer (``E`` is the global expert number; under expert parallelism a
rank holds experts ``rank x E/ep ...`` as its ``local_experts.0 ...``)::

    model.layers.N.mlp.gate.weight                        decoder.layers.N.mlp.router.weight
    model.layers.N.mlp.experts.E.{gate,up}_proj.weight    ...mlp.experts.local_experts.E.linear_fc1.weight
    model.layers.N.mlp.experts.E.down_proj.weight         ...mlp.experts.local_experts.E.linear_fc2.weight

Example::

    fields = moe_fields(spec)          # num_moe_experts=4, moe_router_topk=2, ...
    full = experts_to_megatron(hf, spec, layer=0)
"""

from __future__ import annotations

import re
from typing import Any

import torch

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec

#: Megatron's name of an expert's tensor (global layer, global expert)
EXPERT = "decoder.layers.{}.mlp.experts.local_experts.{}.{}"
ROUTER = "decoder.layers.{}.mlp.router.weight"
HF_EXPERT = "model.layers.{}.mlp.experts.{}.{}"
HF_ROUTER = "model.layers.{}.mlp.gate.weight"
_LOCAL_EXPERT = re.compile(r"(.*\.mlp\.experts\.local_experts\.)(\d+)(\..*)")
#: a checkpoint's experts of one layer, stacked ``[num_experts, ...]`` (``SequentialMLP``)
_SAVED_EXPERTS = re.compile(r"(.*\.mlp\.experts\.)experts\.(linear_fc[12]\.weight)")


def moe_fields(spec: ModelSpec) -> dict[str, Any]:
    """``TransformerConfig`` fields that build the spec's experts (none for a dense spec)."""
    moe = spec.moe
    if moe is None:
        return {}
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.experts_per_token,
        moe_ffn_hidden_size=moe.expert_ffn_hidden_size,
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=moe.aux_loss_coef,
        moe_layer_freq=[int(moe.is_sparse(i)) for i in range(spec.num_layers)],
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        moe_router_dtype="fp32",  # the router's logits and softmax in fp32 under bf16 too
    )


def moe_layout(spec: ModelSpec | None, *, ep: int, capacity_factor: float | None) -> dict[str, Any]:
    """``TransformerConfig`` fields of the expert-parallel degree and the capacity factor:
    none for the defaults; a ``UsageError`` naming the value a dense model or these
    experts cannot take."""
    if ep == 1 and capacity_factor is None:
        return {}
    moe = spec.moe if spec is not None else None
    if moe is None:
        raise UsageError(
            "--ep and --capacity-factor apply to a mixture-of-experts model: pass a Qwen3-MoE "
            "config.json with --model-config or --init-from"
        )
    if ep < 1 or moe.num_experts % ep:
        raise UsageError(
            f"--ep {ep} must divide the model's {moe.num_experts} experts (each rank holds "
            f"num_experts / ep of them); pick a divisor of {moe.num_experts}"
        )
    if capacity_factor is not None and not capacity_factor > 0:
        raise UsageError(f"--capacity-factor must be positive, got {capacity_factor:g}")
    return dict(expert_model_parallel_size=ep, moe_expert_capacity_factor=capacity_factor)


def is_sparse(spec: ModelSpec, layer: int) -> bool:
    """Whether ``layer`` (0-based) of ``spec`` has experts."""
    return spec.moe is not None and spec.moe.is_sparse(layer)


def experts_to_megatron(
    hf: dict[str, torch.Tensor], spec: ModelSpec, layer: int
) -> dict[str, torch.Tensor]:
    """One MoE layer's router and experts, Hugging Face -> full Megatron tensors."""
    assert spec.moe is not None
    out = {ROUTER.format(layer): hf[HF_ROUTER.format(layer)]}
    for e in range(spec.moe.num_experts):
        gate, up = (hf[HF_EXPERT.format(layer, e, f"{p}_proj.weight")] for p in ("gate", "up"))
        out[EXPERT.format(layer, e, "linear_fc1.weight")] = torch.cat([gate, up], dim=0)
        down = hf[HF_EXPERT.format(layer, e, "down_proj.weight")]
        out[EXPERT.format(layer, e, "linear_fc2.weight")] = down
    return out


def experts_to_hf(
    mg: dict[str, torch.Tensor], spec: ModelSpec, layer: int
) -> dict[str, torch.Tensor]:
    """One MoE layer's router and experts, full Megatron -> Hugging Face tensors."""
    assert spec.moe is not None
    out = {HF_ROUTER.format(layer): mg[ROUTER.format(layer)]}
    for e in range(spec.moe.num_experts):
        gate, up = mg[EXPERT.format(layer, e, "linear_fc1.weight")].chunk(2, dim=0)
        out[HF_EXPERT.format(layer, e, "gate_proj.weight")] = gate
        out[HF_EXPERT.format(layer, e, "up_proj.weight")] = up
        down = mg[EXPERT.format(layer, e, "linear_fc2.weight")]
        out[HF_EXPERT.format(layer, e, "down_proj.weight")] = down
    return out


def global_expert_name(name: str, num_experts: int | None) -> str:
    """An expert tensor's name with this rank's local expert number made global (this
    expert-parallel rank holds ``num_experts / ep`` experts, from ``rank x`` that on);
    any other name unchanged."""
    match = _LOCAL_EXPERT.fullmatch(name)
    if match is None or num_experts is None:
        return name
    from megatron.core import parallel_state

    size = parallel_state.get_expert_model_parallel_world_size()
    first = parallel_state.get_expert_model_parallel_rank() * (num_experts // size)
    return f"{match.group(1)}{first + int(match.group(2))}{match.group(3)}"


def hf_expert_name(name: str) -> str | None:
    """The Hugging Face name of a global Megatron router or expert ``linear_fc2`` name
    (``None`` for any other; an expert's fused ``linear_fc1`` is shown as its halves)."""
    router = re.fullmatch(r"decoder\.layers\.(\d+)\.mlp\.router\.weight", name)
    if router is not None:
        return HF_ROUTER.format(router.group(1))
    down = re.fullmatch(
        r"decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.linear_fc2\.weight", name
    )
    if down is not None:
        return HF_EXPERT.format(down.group(1), down.group(2), "down_proj.weight")
    return None


def split_experts(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """A checkpoint tensor by local-spec name: a layer's stacked experts
    (``...mlp.experts.experts.linear_fc1.weight``, ``[num_experts, ...]``, as
    ``dist_checkpointing`` saves them whatever the expert-parallel layout) as one tensor
    per global expert; any other tensor as it is."""
    match = _SAVED_EXPERTS.fullmatch(name)
    if match is None:
        return {name: tensor}
    head, leaf = match.groups()
    return {f"{head}local_experts.{e}.{leaf}": t for e, t in enumerate(tensor.unbind(0))}
