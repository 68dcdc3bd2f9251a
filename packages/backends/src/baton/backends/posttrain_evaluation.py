"""The evaluation of a post-training run on its held-out rows, the same on every engine:
the objective's loss over every held-out row, from each document's log-probability sum
under the current weights (what every engine already computes for DPO's reference).

- SFT: the mean negative log-likelihood over the supervised tokens of the held-out rows
  (the sum over all their supervised targets divided by their count: one mean, however
  the rows are batched);
- DPO: the mean over the held-out pairs of TRL's loss (``sigmoid`` or ``ipo``) against
  the reference's log-probabilities, and TRL's metrics (``rewards/chosen``,
  ``rewards/margins``, ``logps/chosen``...) as means over the same pairs.

Numpy only (the JAX engine uses it without torch). Held-out rows are ``held_out_rows``'
(``baton.data.packed``): the last rows of the training data, or another prepared dataset.

Example (what an engine's ``evaluate`` does)::

    logps = policy_logps(held)                   # [num_sequences], the engine's forward
    metrics = evaluation_metrics(held, logps, objective="dpo", reference=ref_logps,
                                 beta=0.1, loss_type="sigmoid")
    metrics["loss"], metrics["rewards/accuracies"]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from baton.data.packed import PackedDataset

#: the DPO metrics, TRL's names (each a mean over the held-out pairs)
DPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def supervised_counts(data: PackedDataset) -> np.ndarray:
    """``[num_sequences]`` int64: each document of ``data``'s rows, its supervised targets
    (the tokens its log-probability sums over; 0 for documents of other rows)."""
    counts = np.zeros(data.num_sequences, dtype=np.int64)
    for start in range(0, data.num_rows, 256):
        batch = data.batch(list(range(start, min(start + 256, data.num_rows))))
        for row in range(len(batch.documents)):
            documents = batch.documents[row]
            per_segment = np.bincount(
                batch.segments[row][batch.loss_mask[row]], minlength=len(documents) + 1
            )[1:]
            present = documents >= 0
            counts[documents[present]] = per_segment[: len(documents)][present]
    return counts


def evaluation_metrics(
    data: PackedDataset,
    logps: Any,
    *,
    objective: str,
    reference: Any = None,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
) -> dict[str, float]:
    """``{"loss": ..., ...}`` of ``objective`` (``sft`` or ``dpo``) over every row of
    ``data``, from ``logps`` (each sequence's log-probability sum under the current
    weights) and, for DPO, ``reference`` (the reference's, the same indexing)."""
    logps = np.asarray(logps, dtype=np.float64)
    sequences = np.arange(data.sequences.start, data.sequences.stop)
    counts = supervised_counts(data)
    if objective == "sft":
        tokens = counts[sequences].sum()
        return {"loss": float(-logps[sequences].sum() / max(int(tokens), 1))}
    if reference is None:
        raise ValueError("a DPO evaluation needs the reference's log-probabilities")
    reference = np.asarray(reference, dtype=np.float64)
    chosen, rejected = sequences[0::2], sequences[1::2]
    chosen_ratio = logps[chosen] - reference[chosen]
    rejected_ratio = logps[rejected] - reference[rejected]
    if loss_type == "sigmoid":
        losses = np.logaddexp(0.0, -beta * (chosen_ratio - rejected_ratio))  # -logsigmoid
    elif loss_type == "ipo":
        delta = chosen_ratio / np.maximum(counts[chosen], 1) - rejected_ratio / np.maximum(
            counts[rejected], 1
        )
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"DPO loss {loss_type!r}: use sigmoid or ipo")
    rewards_chosen, rewards_rejected = beta * chosen_ratio, beta * rejected_ratio
    values = {
        "loss": losses,
        "rewards/chosen": rewards_chosen,
        "rewards/rejected": rewards_rejected,
        "rewards/margins": rewards_chosen - rewards_rejected,
        "rewards/accuracies": (rewards_chosen > rewards_rejected).astype(np.float64),
        "logps/chosen": logps[chosen],
        "logps/rejected": logps[rejected],
    }
    return {name: float(value.mean()) for name, value in values.items()}
