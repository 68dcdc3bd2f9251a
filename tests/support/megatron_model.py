"""Run the GPTModel of a Megatron-Core backend built by a recipe, outside a training run."""

from __future__ import annotations

from typing import Any

import torch


def megatron_outputs(
    backend: Any, tokens: torch.Tensor, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Set ``backend`` up (under baton's CPU patches where there is no GPU), run its
    single-stage GPTModel causally in eval mode on ``tokens`` and tear it down: the
    logits, or with ``labels`` Megatron's per-token losses (its own cross entropy)."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        model = backend.chunks[0].module.eval()
        length = tokens.shape[1]
        positions = torch.arange(length).unsqueeze(0).expand_as(tokens)
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
        with torch.no_grad():
            return model(tokens, positions, mask, labels=labels)
    finally:
        backend.teardown()
        recorder.undo()


def first_micro_batches(backend: Any, count: int = 1) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` micro-batches ``backend``'s training would read on one rank
    (set up and torn down under baton's CPU patches): each with ``tokens``, ``labels``,
    ``loss_mask``, ``position_ids``."""
    from baton.backends.megatron import cpu
    from baton.core.patches import PatchRecorder

    recorder = PatchRecorder()
    if not torch.cuda.is_available():
        cpu.install_all(recorder)
    try:
        backend.setup()
        return [next(backend.train_streams[0]) for _ in range(count)]
    finally:
        backend.teardown()
        recorder.undo()


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
