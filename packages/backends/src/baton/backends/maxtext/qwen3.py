"""Qwen3 and Qwen3-MoE as MaxText builds them: its ``qwen3`` and ``qwen3_moe`` decoder
blocks (QK norm, ``head_dim`` independent of the width, attention scaled by
``head_dim ** -0.5`` in the layer rather than folded into the query kernel) and its
``RoutedMoE`` experts.

On CPU the experts run MaxText's dense einsum path (:data:`CPU_EXPERTS`:
``sparse_matmul: False``, ``megablox: False``; the grouped-matmul kernels need a TPU or
GPU, and a recipe for those keeps MaxText's sparse path). Without a capacity factor
every token goes through every expert, weighted by its router weights (zero off its
top-k): dropless. With ``capacity_factor`` > 0 MaxText dispatches each sequence's
tokens to fixed-size expert buffers and drops those past an expert's capacity.

MaxText's router takes the top-k gate logits and softmaxes them, which is Hugging
Face's ``norm_topk_prob: true``; every decoder layer is sparse. A spec asking for
anything else is refused by name (:func:`check_buildable`) before anything is built.

MaxText's load-balancing loss is Switch Transformer's per sequence with the token
fractions divided by top-k, averaged over the sequences and over the layers;
``transformers``' is over all tokens of all layers at once, fractions not divided by
top-k. ``load_balance_loss_weight`` is ``router_aux_loss_coef * top_k`` so both have the
same scale (``coef * top_k`` at perfect balance); the remaining difference is the
per-sequence and per-layer averaging (see docs/one-model.md).

The parameter layout is MaxText's own Qwen converter's
(``maxtext.checkpoint_conversion.utils.param_mapping.QWEN_MAXTEXT_TO_HF_PARAM_MAPPING``):
the gate kernel ``[embed, layers, experts]``, the experts ``[experts, layers, in, out]``.

Example::

    settings |= qwen3_settings(spec)            # decoder_block, use_qk_norm, experts
    settings |= CPU_EXPERTS                     # on CPU
    layers["moe_block"] = experts_to_maxtext(hf, spec)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from baton.core.errors import UsageError
from baton.core.model.spec import ModelSpec

#: MaxText's expert path that runs on CPU: dense einsums over all the experts
CPU_EXPERTS = {"sparse_matmul": False, "megablox": False}


def check_buildable(spec: ModelSpec) -> None:
    """Raise ``UsageError`` naming each value of a Qwen3 spec MaxText cannot build."""
    if spec.rope_scaling is not None:
        raise UsageError(
            f"maxtext cannot build a {spec.family} with rope_scaling; drop rope_scaling from "
            "the config, or train it with recipes/hf_finetune.py"
        )
    moe = spec.moe
    if moe is None:
        return
    if not moe.norm_topk_prob:
        raise UsageError(
            "maxtext cannot build norm_topk_prob: false (its router always renormalises the "
            "top-k weights); set norm_topk_prob: true, or train this model with "
            "recipes/hf_finetune.py"
        )
    if moe.sparse_step != 1 or moe.dense_layers:
        raise UsageError(
            f"maxtext cannot build decoder_sparse_step={moe.sparse_step}, mlp_only_layers="
            f"{list(moe.dense_layers)} (its qwen3_moe decoder has experts in every layer); "
            "use decoder_sparse_step: 1 and no mlp_only_layers"
        )


def check_expert_parallel(spec: ModelSpec | None, ep: int) -> None:
    """Refuse ``--ep`` (``ici_expert_parallelism``) above 1 for a spec without experts, or
    one that does not divide the experts, naming both numbers."""
    if ep <= 1 or spec is None:
        return
    if spec.moe is None:
        raise UsageError(
            f"--ep {ep}: this {spec.family} model has no experts to split; lay the devices "
            "out with --dp-shard, --dp-replicate or --tp"
        )
    if spec.moe.num_experts % ep:
        raise UsageError(
            f"--ep {ep} does not divide the model's {spec.moe.num_experts} experts; use a "
            f"divisor of {spec.moe.num_experts}"
        )


def qwen3_settings(spec: ModelSpec) -> dict[str, Any]:
    """MaxText config keys of a ``qwen3`` or ``qwen3_moe`` spec (the rest is shared with
    Llama); a value MaxText cannot build is a ``UsageError`` naming it."""
    check_buildable(spec)
    moe = spec.moe
    if moe is None:
        return {"decoder_block": "qwen3", "use_qk_norm": True}
    return {
        "decoder_block": "qwen3_moe",
        "use_qk_norm": True,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.experts_per_token,
        "base_moe_mlp_dim": moe.expert_ffn_hidden_size,
        "base_mlp_dim": moe.expert_ffn_hidden_size,  # MaxText: equal in a fully sparse model
        "norm_topk_prob": True,
        "load_balance_loss_weight": moe.aux_loss_coef * moe.experts_per_token,
        "capacity_factor": -1.0,  # dropless, as transformers
    }


def experts_to_maxtext(hf: dict[str, np.ndarray], spec: ModelSpec) -> dict[str, Any]:
    """The scanned ``moe_block`` of MaxText's layers from Hugging Face tensors."""
    assert spec.moe is not None
    layers, experts = range(spec.num_layers), range(spec.moe.num_experts)

    def expert(projection: str) -> np.ndarray:
        return np.stack([
            np.stack([hf[f"model.layers.{i}.mlp.experts.{e}.{projection}.weight"].T
                      for i in layers])
            for e in experts
        ])  # fmt: skip

    gate = np.stack([hf[f"model.layers.{i}.mlp.gate.weight"].T for i in layers], axis=1)
    return {
        "gate": {"kernel": gate},
        "wi_0": expert("gate_proj"),
        "wi_1": expert("up_proj"),
        "wo": expert("down_proj"),
    }


def experts_to_hf(moe_block: dict[str, Any], spec: ModelSpec) -> dict[str, np.ndarray]:
    """Hugging Face ``Qwen3MoeForCausalLM`` expert tensors from MaxText's scanned
    ``moe_block``."""
    assert spec.moe is not None
    out: dict[str, np.ndarray] = {}
    projections = {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}
    for i in range(spec.num_layers):
        out[f"model.layers.{i}.mlp.gate.weight"] = np.asarray(moe_block["gate"]["kernel"])[:, i].T
        for key, projection in projections.items():
            stacked = np.asarray(moe_block[key])
            for e in range(spec.moe.num_experts):
                out[f"model.layers.{i}.mlp.experts.{e}.{projection}.weight"] = stacked[e, i].T
    return out
