"""What a torch engine hands an objective's loss (``baton.core.objectives``), computed
once for Fabric, TorchTitan and Megatron-Core: per-token log-probabilities of the targets
at the objective's temperature, the per-token entropy where the objective reads it, and a
step's metrics as ``(sum, weight)`` pairs in one tensor, so micro-batches add them and
ranks reduce them in one collective.

Example::

    rows = Rows(mask, segments, documents, values)
    inputs = loss_inputs(run, rows, logits, targets)          # LossInputs at run.temperature
    terms = run.loss(array_namespace(inputs.logps), inputs)
    sums = metric_sums(terms, run.objective.metrics, like=terms.total)   # [2, M], detached
    means = metric_means(all_reduce(sums_over_micro_batches), run.objective.metrics)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from baton.core.objectives import LossInputs, LossTerms, ObjectiveRun, Rows

#: the target id that marks "no target here" (padding)
IGNORE = -100


def token_logps(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log p(targets[b, t])`` under ``logits[b, t] / temperature``, float32, shaped like
    ``targets`` (0 where a target is ``IGNORE``)."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    flat = F.cross_entropy(
        scaled.flatten(0, -2), targets.flatten(), reduction="none", ignore_index=IGNORE
    )
    return -flat.view(targets.shape)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The entropy of each predicted distribution (``logits / temperature``), float32,
    ``[B, T]``, without gradient."""
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logps.exp() * logps).sum(dim=-1)


def loss_inputs(
    run: ObjectiveRun, rows: Rows, logits: torch.Tensor, targets: torch.Tensor
) -> LossInputs:
    """The objective's inputs from a full-vocabulary ``logits`` ``[B, T, V]`` predicting
    ``targets`` ``[B, T]`` (any id where the mask is False)."""
    safe = targets.masked_fill(targets < 0, 0)
    logps = token_logps(logits, safe, run.temperature)
    entropy = token_entropy(logits, run.temperature) if run.objective.entropy else None
    return LossInputs(rows, logps, entropy)


def metric_sums(terms: LossTerms, names: Sequence[str], like: torch.Tensor) -> torch.Tensor:
    """``[2, M]`` float32, detached: each of ``names``'s ``(sum, weight)`` (zeros for a
    name the terms do not hold)."""
    out = torch.zeros(2, len(names), dtype=torch.float32, device=like.device)
    for i, name in enumerate(names):
        if name in terms.metrics:
            total, weight = terms.metrics[name]
            out[0, i] = torch.as_tensor(total).detach().float()
            out[1, i] = torch.as_tensor(weight).detach().float()
    return out


def metric_means(sums: torch.Tensor, names: Sequence[str]) -> dict[str, Any]:
    """Each metric's mean over the global batch, ``sum / weight`` (lazy device values:
    nothing is copied to the host). ``names``: the metrics the run's loss returns (the
    keys of its first ``LossTerms.metrics``)."""
    return {name: sums[0, i] / sums[1, i].clamp(min=1e-12) for i, name in enumerate(names)}
