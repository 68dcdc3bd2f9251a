"""The mixture-of-experts metrics of a ``transformers`` model trained on Fabric.

A ``Qwen3MoeForCausalLM`` (any ``transformers`` MoE model with ``output_router_logits``
on) adds its load-balancing loss to ``output.loss`` itself; :func:`with_moe_metrics`
wraps a loss function so the step also returns, as device tensors read only on log steps:

- ``moe/aux_loss``: the load-balancing term as the model added it (coefficient times
  ``output.aux_loss``);
- ``moe/load_balance``: tokens routed to the busiest expert over the mean per expert,
  the largest over the MoE layers (each layer's top-k choices from its router logits).

``transformers``' routers are dropless, so no ``moe/dropped_fraction``.

Example::

    loss_fn = with_moe_metrics(None, aux_loss_coef=0.01, experts_per_token=2)
    loss, metrics = loss_fn(model, {"input_ids": ids, "labels": ids})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def load_balance(router_logits: Sequence[torch.Tensor], experts_per_token: int) -> torch.Tensor:
    """Max over layers of (tokens sent to the busiest expert / mean tokens per expert),
    from each MoE layer's router logits (``[tokens, experts]``); a 0-d tensor, no host
    sync. Top-k of the logits picks the same experts as top-k of the softmax.

    >>> logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 0.0, 1.0]])
    >>> float(load_balance([logits], experts_per_token=1))  # both tokens to expert 0
    3.0
    """
    ratios = []
    for logits in router_logits:
        flat = logits.reshape(-1, logits.shape[-1])
        chosen = flat.topk(experts_per_token, dim=-1).indices.reshape(-1)
        counts = torch.bincount(chosen, minlength=flat.shape[-1]).float()
        ratios.append(counts.max() / counts.mean())
    return torch.stack(ratios).max()


def with_moe_metrics(
    loss_fn: Callable[[Any, Any], Any] | None,
    *,
    aux_loss_coef: float,
    experts_per_token: int,
) -> Callable[[Any, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """A loss function returning ``(loss, {"moe/aux_loss", "moe/load_balance"})``.

    ``loss_fn`` is ``None`` for a dict batch the model scores itself (``model(**batch)``),
    else a ``(model, batch) -> output`` callable returning the model's output (with
    ``loss``, ``aux_loss`` and ``router_logits``)."""

    def loss_and_metrics(model: Any, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        output = model(**batch) if loss_fn is None else loss_fn(model, batch)
        with torch.no_grad():
            metrics = {
                "moe/aux_loss": aux_loss_coef * output.aux_loss.detach(),
                "moe/load_balance": load_balance(output.router_logits, experts_per_token),
            }
        return output.loss, metrics

    return loss_and_metrics
