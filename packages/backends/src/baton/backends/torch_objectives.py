"""Post-training objectives for every torch engine: token log-probabilities, per-document
sums, the SFT loss and the DPO losses and metrics, with TRL's conventions.

Inputs are a packed batch's tensors (``baton.data.packed.PackedBatch``): ``logits``
``[B, T, V]`` predicting ``targets`` ``[B, T]``, ``loss_mask`` ``[B, T]`` (True where the
target is supervised), ``segments`` ``[B, T]`` (document 1..k of each input token, 0 on
padding) and ``documents`` ``[B, D]`` (global sequence index of document d + 1, -1 where
the row has fewer). Log-probabilities are computed in float32 whatever the logits' dtype.

SFT: the loss of a step is the sum of cross entropy over the supervised targets of the
global batch (all micro-batches and ranks) divided by their count: each micro-batch
contributes ``sft_loss_sum(...) / global_count``.

DPO (``DPOTrainer``'s semantics): a document's log-probability is the sum over its
supervised targets; documents 2k-1 and 2k of a row are a pair (chosen, rejected).
``logits = (pi_c - pi_r) - (ref_c - ref_r)``; sigmoid: ``-logsigmoid(beta * logits)``;
IPO: ``(d - 1 / (2 * beta)) ** 2`` with ``d`` the log-ratios divided by each completion's
token count (TRL's IPO averages over completion tokens). The loss is the mean over the
pairs of the global batch: each micro-batch contributes ``losses.sum() / global_pairs``.

Example::

    from baton.backends import torch_objectives as objectives

    logits = model(input_ids=inputs, position_ids=positions).logits
    loss = objectives.sft_loss_sum(logits, targets, loss_mask) / global_tokens

    logps, counts = objectives.document_logps(logits, targets, loss_mask, segments, D)
    # split_pairs, then dpo_losses and dpo_metric_sums on the (chosen, rejected) halves
    losses, sums = objectives.pair_losses(logps, counts, reference[documents.clamp(min=0)],
                                          documents, beta=0.1, loss_type="ipo")
    loss = losses.sum() / global_pairs
    metrics = {name: total / global_pairs for name, total in sums.items()}  # TRL's means
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: the DPO losses: TRL's ``loss_type`` names
DPO_LOSSES = ("sigmoid", "ipo")
#: the DPO metrics, TRL's names (each a mean over the pairs of the global batch)
DPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log p(targets[b, t])`` under ``logits[b, t]``, float32, shape of ``targets``
    (0 where a target is -100)."""
    flat = F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), reduction="none", ignore_index=-100
    )
    return -flat.view(targets.shape)


def sft_loss_sum(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """The sum of cross entropy over the supervised targets (float32 scalar)."""
    labels = targets.masked_fill(~loss_mask.bool(), -100)
    return F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), reduction="sum", ignore_index=-100
    )


def segment_sums(values: torch.Tensor, segments: torch.Tensor, num_segments: int) -> torch.Tensor:
    """``[B, num_segments]``: the sum of ``values`` ``[B, T]`` over the tokens of each
    document 1..num_segments of each row (segment 0, padding, is left out)."""
    sums = values.new_zeros(values.shape[0], num_segments + 1)
    sums = sums.scatter_add(1, segments.long(), values)
    return sums[:, 1:]


def document_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
    segments: torch.Tensor,
    num_segments: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps, counts)``, each ``[B, num_segments]``: per document, the sum of the
    log-probabilities of its supervised targets and their number (float32)."""
    mask = loss_mask.to(torch.float32)
    logps = token_logps(logits, targets) * mask
    return segment_sums(logps, segments, num_segments), segment_sums(mask, segments, num_segments)


def split_pairs(
    per_document: torch.Tensor, documents: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)``, each ``[P]``: documents 1, 3, 5... and 2, 4, 6... of every
    row (``per_document`` ``[B, D]``), the pairs present (``documents >= 0``) in row order."""
    present = documents[:, 0::2] >= 0
    return per_document[:, 0::2][present], per_document[:, 1::2][present]


def dpo_losses(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    chosen_tokens: torch.Tensor | None = None,
    rejected_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[P]``: each pair's DPO loss (TRL's ``sigmoid`` or ``ipo``). The log-probabilities
    are per-document sums; ``ipo`` needs each completion's supervised token count."""
    chosen = policy_chosen - reference_chosen.to(policy_chosen.dtype)
    rejected = policy_rejected - reference_rejected.to(policy_rejected.dtype)
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * (chosen - rejected))
    if loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("the ipo loss needs chosen_tokens and rejected_tokens")
        delta = chosen / chosen_tokens.clamp(min=1) - rejected / rejected_tokens.clamp(min=1)
        return (delta - 1 / (2 * beta)) ** 2
    raise ValueError(f"DPO loss {loss_type!r}: use one of {', '.join(DPO_LOSSES)}")


def dpo_metric_sums(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
) -> dict[str, torch.Tensor]:
    """TRL's DPO metrics (:data:`DPO_METRICS`) summed over the pairs (detached scalars):
    divided by the global batch's pair count they are TRL's means."""
    policy_chosen, policy_rejected = policy_chosen.detach(), policy_rejected.detach()
    chosen = beta * (policy_chosen - reference_chosen.to(policy_chosen.dtype))
    rejected = beta * (policy_rejected - reference_rejected.to(policy_rejected.dtype))
    return {
        "rewards/chosen": chosen.sum(),
        "rewards/rejected": rejected.sum(),
        "rewards/margins": (chosen - rejected).sum(),
        "rewards/accuracies": (chosen > rejected).to(chosen.dtype).sum(),
        "logps/chosen": policy_chosen.sum(),
        "logps/rejected": policy_rejected.sum(),
    }


def pair_losses(
    logps: torch.Tensor,
    counts: torch.Tensor,
    reference: torch.Tensor,
    documents: torch.Tensor,
    *,
    beta: float,
    loss_type: str,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each pair's DPO loss ``[P]`` and TRL's metrics summed over the pairs
    (:func:`dpo_metric_sums`), from every document's policy log-probability, supervised
    token count and reference log-probability (each ``[B, D]``, as ``documents``)."""
    policy_chosen, policy_rejected = split_pairs(logps, documents)
    reference_chosen, reference_rejected = split_pairs(reference, documents)
    chosen_tokens, rejected_tokens = split_pairs(counts, documents)
    losses = dpo_losses(
        policy_chosen, policy_rejected, reference_chosen, reference_rejected,
        beta=beta, loss_type=loss_type,
        chosen_tokens=chosen_tokens, rejected_tokens=rejected_tokens,
    )  # fmt: skip
    sums = dpo_metric_sums(
        policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta=beta
    )
    return losses, sums
