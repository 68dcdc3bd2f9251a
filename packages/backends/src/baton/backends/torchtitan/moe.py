"""The mixture-of-experts MLP of a Qwen3-MoE :class:`~baton.core.model.spec.ModelSpec`
as TorchTitan's own ``MoE`` layer: its token-choice top-k router (softmax scores, the
spec's ``norm_topk_prob`` as ``route_norm``), its grouped experts and its token
dispatcher (all-to-all across the expert-parallel mesh, local without one; dropless).

What maps, and what does not (``transformers``' ``Qwen3MoeSparseMoeBlock`` is the
reference):

- Routing and experts are the same function: softmax over the router logits, the top
  ``experts_per_token`` experts, optionally renormalised, each a SwiGLU of width
  ``expert_ffn_hidden_size``; a layer the spec keeps dense (``dense_layers``,
  ``sparse_step``) is TorchTitan's dense feed-forward of ``ffn_hidden_size``.
- The experts compute in their weights' dtype (:class:`ParamDtypeGroupedExperts`):
  TorchTitan's ``GroupedExperts`` casts to bfloat16 always (its GPU grouped-GEMM path),
  which would make an fp32 model differ from ``transformers`` by bf16 rounding. Under
  mixed precision the weights are bf16 in the forward pass, as TorchTitan computes.
- No auxiliary loss: TorchTitan's Qwen3-MoE adds no load-balancing loss to the loss
  (``router_aux_loss_coef`` is not applied; a warning says so) and balances, where
  enabled, with an expert bias (``MoE.load_balance_coeff``, auxiliary-loss-free
  balancing). Hugging Face's Qwen3-MoE has no such bias, so it is off by default
  (``load_balance_coeff=None``): the trained model exports as exactly the model that
  trained. :func:`use_expert_bias` turns it on (the recipes' ``--expert-bias RATE``);
  ``baton export`` then refuses the checkpoint (:func:`expert_bias_refusal`).

Example::

    config = qwen3_model_config(spec)                 # MoE layers from moe_config(spec, ...)
    use_expert_bias(trainer_config, 1e-3)             # TorchTitan's bias balancing on
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torchtitan.models.common.moe import GroupedExperts

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec

logger = logging.getLogger(__name__)


class ParamDtypeGroupedExperts(GroupedExperts):
    """TorchTitan's ``GroupedExperts`` (same weights ``w1_EFD``, ``w2_EDF``, ``w3_EFD``,
    same ``_grouped_mm``) computing in its weights' dtype instead of always bfloat16."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        """The SwiGLU of each expert over its contiguous run of routed tokens."""
        w1, w2, w3 = (_local(w) for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD))
        offsets = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        x = x_RD.to(w1.dtype)
        gate = self._grouped_mm(A=x, B_t=w1.transpose(-2, -1), offs=offsets)
        up = self._grouped_mm(A=x, B_t=w3.transpose(-2, -1), offs=offsets)
        out = self._grouped_mm(A=F.silu(gate) * up, B_t=w2.transpose(-2, -1), offs=offsets)
        return out.type_as(x_RD)


def _local(weight: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (expert parallelism shards the expert dimension)."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if to_local is not None else weight


def warn_unapplied(spec: ModelSpec) -> None:
    """Say once per build what of the spec TorchTitan does not apply (the auxiliary loss)."""
    if spec.moe is not None and spec.moe.aux_loss_coef:
        logger.warning(
            "torchtitan adds no auxiliary load-balancing loss: router_aux_loss_coef=%s of "
            "the model config is not applied (Fabric/hf_finetune.py applies it)",
            spec.moe.aux_loss_coef,
        )


def moe_config(spec: ModelSpec, init: dict[str, Any], expert_init: dict[str, Any]) -> Any:
    """TorchTitan's ``MoE.Config`` for the experts of ``spec`` (a ``qwen3_moe`` spec)."""
    from torchtitan.models.common.config_utils import (
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )

    experts = spec.moe
    assert experts is not None, "moe_config needs a qwen3_moe spec"
    routed = make_routed_experts_config(
        dim=spec.hidden_size,
        hidden_dim=experts.expert_ffn_hidden_size,
        num_experts=experts.num_experts,
        top_k=experts.experts_per_token,
        param_init=expert_init,
        comm_backend="standard",  # all-to-all under expert parallelism, local without
    )
    inner = routed.inner_experts
    routed.inner_experts = ParamDtypeGroupedExperts.Config(
        dim=inner.dim,
        hidden_dim=inner.hidden_dim,
        num_experts=inner.num_experts,
        param_init=inner.param_init,
    )
    return make_moe_config(
        num_experts=experts.num_experts,
        router=make_router_config(
            dim=spec.hidden_size,
            num_experts=experts.num_experts,
            gate_param_init=init,
            top_k=experts.experts_per_token,
            score_func="softmax",
            route_norm=experts.norm_topk_prob,
        ),
        routed_experts=routed,
        load_balance_coeff=None,
    )


def expert_init(std: float = 0.02) -> dict[str, Any]:
    """Normal initialisers of the grouped experts' three weights."""
    import torch.nn as nn

    normal = partial(nn.init.normal_, std=std)
    return {"w1_EFD": normal, "w2_EDF": normal, "w3_EFD": normal}


#: the name of TorchTitan's expert-bias buffer in a checkpoint (``layers.N.moe.<name>``)
EXPERT_BIAS = "expert_bias_E"


def use_expert_bias(config: Any, rate: float) -> int:
    """Turn on TorchTitan's auxiliary-loss-free balancing in a ``Trainer.Config``: every
    MoE layer's ``load_balance_coeff`` (the step of the expert-bias update) is ``rate``;
    returns how many layers it set. A model without experts is a ``UsageError``."""
    from torchtitan.models.common.moe import MoE

    if not rate > 0:
        raise UsageError(f"--expert-bias must be a positive update rate, got {rate!r}")
    layers = list(config.model_spec.model.traverse(MoE.Config))
    if not layers:
        raise UsageError(
            "--expert-bias balances the experts of a mixture-of-experts model; this model has "
            "none (pass a Qwen3-MoE with --model-config or --init-from)"
        )
    for _fqn, moe, _parent, _attr in layers:
        moe.load_balance_coeff = rate
    return len(layers)


def expert_bias_refusal(weights: dict[str, Any]) -> str | None:
    """Why a checkpoint's weights cannot export as a Hugging Face Qwen3-MoE: an expert
    bias that routing adds (a run trained with :func:`use_expert_bias`); ``None`` if
    there is none or it is zero."""
    biased = [key for key, value in weights.items() if key.endswith(EXPERT_BIAS) and value.any()]
    if not biased:
        return None
    return (
        f"{biased[0]} is not zero: this run balanced its experts with TorchTitan's expert "
        "bias (--expert-bias), which routing adds and Hugging Face's Qwen3-MoE has no place "
        "for, so the exported model would route differently; train without --expert-bias "
        "to export"
    )


def expert_parallel_refusal(config: Any) -> str | None:
    """Why a ``Trainer.Config``'s expert-parallel degree cannot apply: a model without
    experts, or experts that the degree does not divide; ``None`` when it fits."""
    from torchtitan.models.common.moe import MoE

    ep = int(getattr(config.parallelism, "expert_parallel_degree", 1))
    if ep <= 1:
        return None
    layers = [moe for _fqn, moe, _p, _a in config.model_spec.model.traverse(MoE.Config)]
    if not layers:
        return (
            f"expert parallel degree {ep} needs a mixture-of-experts model; this one has no "
            "experts (pass a Qwen3-MoE with --model-config or --init-from, or drop --ep)"
        )
    experts = layers[0].num_experts
    if experts % ep:
        return f"expert parallel degree {ep} does not divide the model's {experts} experts"
    return None
