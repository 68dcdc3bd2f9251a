"""Run the GPTModel of a Megatron-Core backend built by a recipe, outside a training run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def set_up(backend: Any) -> Iterator[Any]:
    """``backend`` set up under baton's CPU patches (where there is no GPU), torn down
    and the patches undone after."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        yield backend
    finally:
        backend.teardown()
        recorder.undo()


def causal(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The position ids and causal attention mask of ``tokens`` (``[batch, length]``)."""
    length = tokens.shape[1]
    positions = torch.arange(length).unsqueeze(0).expand_as(tokens)
    return positions, torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]


def megatron_outputs(
    backend: Any, tokens: torch.Tensor, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Set ``backend`` up, run its single-stage GPTModel causally in eval mode on
    ``tokens`` and tear it down: the logits, or with ``labels`` Megatron's per-token
    losses (its own cross entropy)."""
    with set_up(backend), torch.no_grad():
        model = backend.chunks[0].module.eval()
        return model(tokens, *causal(tokens), labels=labels)


def megatron_losses(
    backend: Any, tokens: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Set ``backend`` up, run its single-stage GPTModel causally in training mode (its
    router adds the load-balancing loss only there; no weights change) on one micro-batch
    and tear it down: Megatron's per-token losses and ``moe/aux_loss`` as the backend
    reports it for that micro-batch (the coefficient times the layers' tracked
    ``load_balancing_loss``)."""
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    with set_up(backend):
        model = backend.chunks[0].module.train()
        tracker = get_moe_metrics_tracker()
        tracker.clear()
        per_token = model(tokens, *causal(tokens), labels=labels).detach()
        tracked = tracker.metrics["load_balancing_loss"].values
        aux = float(tracked.sum()) * model.config.moe_aux_loss_coeff
        tracker.clear()
        return per_token, aux


def first_micro_batches(backend: Any, count: int = 1) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` micro-batches ``backend``'s training would read on one rank
    (set up and torn down): each with ``tokens``, ``labels``, ``loss_mask``,
    ``position_ids``."""
    with set_up(backend):
        return [next(backend.train_streams[0]) for _ in range(count)]


def megatron_aux_loss(router_logits: Any, *, top_k: int, experts: int) -> torch.Tensor:
    """Megatron's ``aux_loss`` from each layer's router logits: Switch Transformer's
    ``E x sum_i f_i P_i`` per layer, ``f_i`` the share of the ``tokens x top_k`` routed
    slots expert i takes, ``P_i`` its mean softmax probability; summed over layers."""
    total = torch.zeros(())
    for logits in router_logits:
        probs = logits.softmax(-1)
        chosen = torch.nn.functional.one_hot(probs.topk(top_k, -1).indices, experts)
        share = chosen.sum(1).float().mean(0) / top_k
        total += experts * (share * probs.mean(0)).sum()
    return total
