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


class RouterBalance:
    """The load-balancing term of a ``transformers`` mixture-of-experts model on packed
    rows, over the rows' input tokens only (padding excluded), as a share of the global
    batch.

    On packed rows the model is called without an attention mask (it reads documents
    from the restarting positions), so its own ``aux_loss`` would count padding. This
    term is the model's own ``load_balancing_loss_func`` with the row's tokens as its
    mask, times the coefficient, times ``share`` (the micro-batch's part of the global
    batch's items): summed over micro-batches and ranks it is their weighted mean, as
    the step's loss and metrics are (``FabricBackend(mean_over=...)``). It equals what
    ``transformers`` adds for the same documents each run alone, pooled, less each row's
    last token (it predicts nothing, so it is no input).

    Example::

        balance = RouterBalance(config, aux_loss_coef=0.01)
        output = model(input_ids=ids, position_ids=positions, output_router_logits=True)
        term, metrics = balance(output.router_logits, segments > 0, share=1.0)
    """

    def __init__(self, config: Any, aux_loss_coef: float) -> None:
        import importlib

        module = importlib.import_module(
            f"transformers.models.{config.model_type}.modeling_{config.model_type}"
        )
        self.loss_of: Callable[..., torch.Tensor] = module.load_balancing_loss_func
        self.experts: int = config.num_experts
        self.experts_per_token: int = config.num_experts_per_tok
        self.coef = aux_loss_coef

    def __call__(
        self,
        router_logits: Sequence[torch.Tensor],
        tokens: torch.Tensor,
        share: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(coefficient x load-balancing loss x share, {"moe/aux_loss",
        "moe/load_balance"} x share)``; ``tokens`` is ``[batch, seq]``, true where a row
        holds a token."""
        logits = tuple(router_logits)
        term = self.coef * self.loss_of(logits, self.experts, self.experts_per_token, tokens)
        with torch.no_grad():
            kept = tokens.reshape(-1)
            balance = load_balance([layer[kept] for layer in logits], self.experts_per_token)
            metrics = {"moe/aux_loss": term.detach() * share, "moe/load_balance": balance * share}
        return term * share, metrics
