"""What a Megatron step minimises (``config.objective``): how the model config is set for
it and which forward step the schedule runs.

Every run lets Megatron's schedule finish the gradients (``finalize_model_grads_func``,
as Megatron-LM sets it): the data-parallel reduction and, for SFT and DPO, Megatron's
per-token loss normalisation (``calculate_per_token_loss``), in which each micro-batch's
loss function returns a sum and a count and the gradients are divided by the count of
the global batch (every micro-batch and data-parallel rank), so the step's loss is one
mean over the global batch whatever the micro-batching.

Example (a recipe's flags, then what ``MegatronBackend.setup`` does before building the
model)::

    set_objective(config, "dpo", dpo_beta=0.1, dpo_loss="sigmoid", reference=None)
    use_objective(config)
    forward_step = forward_step_of(config)   # then run_schedule(..., forward_step=...)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.posttrain_step import packed_forward_step, sft_loss
from baton.backends.megatron.step import global_sums, gpt_forward_step
from baton.backends.torch_objectives import DPO_LOSSES
from baton.core.errors import UsageError

#: what a step may minimise (the vocabulary's ``objective``)
OBJECTIVES = ("pretrain", "sft", "dpo")


def set_objective(
    config: MegatronConfig,
    objective: str,
    *,
    dpo_beta: float = 0.1,
    dpo_loss: str = "sigmoid",
    reference: str | None = None,
) -> None:
    """A recipe's ``--objective``, ``--dpo-beta``, ``--dpo-loss`` and ``--reference`` into
    ``config``; ``UsageError`` (one line, the fix) for a value outside their choices."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if dpo_loss not in DPO_LOSSES:
        raise UsageError(f"--dpo-loss {dpo_loss!r}: use one of {', '.join(DPO_LOSSES)}")
    if not dpo_beta > 0:
        raise UsageError(f"--dpo-beta {dpo_beta}: DPO's beta must be above 0 (TRL's default 0.1)")
    if reference is not None and objective != "dpo":
        raise UsageError("--reference is DPO's reference model: add --objective dpo")
    config.objective = objective  # pyright: ignore[reportAttributeAccessIssue]
    config.dpo_beta = dpo_beta
    config.dpo_loss = dpo_loss  # pyright: ignore[reportAttributeAccessIssue]
    config.reference = reference


def use_objective(config: MegatronConfig) -> None:
    """Set the model config for ``config.objective`` (before the model and Megatron's DDP
    are built: DDP reads ``calculate_per_token_loss`` when it is constructed)."""
    from megatron.core.distributed import finalize_model_grads

    if config.objective != "pretrain" and config.layer_spec == "transformer_engine":
        raise UsageError(
            f"--objective {config.objective} runs Megatron's local layers (packed documents "
            "as an attention mask; Transformer Engine's THD path is not built): set "
            "layer_spec to auto or local"
        )
    config.model.finalize_model_grads_func = finalize_model_grads
    config.model.calculate_per_token_loss = config.objective != "pretrain"


def forward_step_of(config: MegatronConfig) -> Callable[..., Any]:
    """The ``forward_step_func`` of ``config.objective``."""
    if config.objective == "sft":
        return partial(packed_forward_step, sft_loss)
    if config.objective == "dpo":
        from baton.backends.megatron.posttrain_step import dpo_loss

        return partial(
            packed_forward_step, partial(dpo_loss, beta=config.dpo_beta, kind=config.dpo_loss)
        )
    return gpt_forward_step


def objective_metrics(
    config: MegatronConfig, reduced: list[dict[str, Any]], device: Any
) -> dict[str, Any]:
    """A DPO step's metrics, TRL's names (``rewards/chosen``, ``rewards/margins``,
    ``logps/chosen``...), each a mean over the pairs of the global batch; ``{}`` for the
    other objectives."""
    if config.objective != "dpo":
        return {}
    from baton.backends.torch_objectives import DPO_METRICS

    sums = global_sums(reduced, "dpo", len(DPO_METRICS) + 1, device)
    pairs = sums[-1].clamp(min=1)
    return {name: sums[i] / pairs for i, name in enumerate(DPO_METRICS)}
