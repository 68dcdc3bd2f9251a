"""Direct preference optimisation with TRL's ``DPOTrainer`` conventions, over preference
pairs packed into rows (documents 2k-1 and 2k of a row: chosen, then rejected).

A document's log-probability is the sum over its supervised targets (the completion).
For each pair, with ``c = pi_c - ref_c`` and ``r = pi_r - ref_r`` (policy minus
reference):

- ``sigmoid``: ``-log_sigmoid(beta * (c - r))``;
- ``ipo``: ``(c / n_c - r / n_r - 1 / (2 * beta)) ** 2``, the log-ratios averaged over
  each completion's ``n`` supervised tokens (TRL's IPO).

The loss is the mean over the pairs of the global batch. The reference's
log-probabilities are computed once, by the engine that trains, before the first step,
and stored beside the data (``ReferenceUse.STORED``: the ``reference_logps`` document
value). Metrics, TRL's names and meanings, means over the pairs: ``rewards/chosen``
(``beta * c``), ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``,
``logps/chosen``, ``logps/rejected``.

Example::

    run = ObjectiveRun.of("dpo", dpo_beta=0.1, dpo_loss="ipo")
    terms = run.loss(xp, LossInputs(rows, logps))   # rows.values["reference_logps"]: [B, D]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.objectives.array_math import (
    as_float,
    document_sums,
    present_documents,
    softplus,
)
from baton.core.objectives.declaration import (
    DataKind,
    LossInputs,
    LossTerms,
    Objective,
    ReferenceUse,
    Rows,
    Setting,
)
from baton.core.objectives.reference_setting import REFERENCE

#: TRL's DPO loss names this objective computes
DPO_LOSSES = ("sigmoid", "ipo")
#: TRL's DPO metrics, each a mean over the pairs of the global batch
DPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def pair_count(xp: Any, rows: Rows, settings: Mapping[str, Any]) -> Any:
    """The preference pairs of the rows."""
    return xp.sum(present_documents(xp, rows.documents[:, 0::2]))


def dpo_loss(xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms:
    """The DPO loss summed over the pairs, and TRL's metrics (sums over the pairs)."""
    rows = inputs.rows
    width = rows.documents.shape[1]
    mask = as_float(xp, rows.mask)
    logps = document_sums(xp, inputs.logps * mask, rows.segments, width)
    counts = document_sums(xp, mask, rows.segments, width)
    present = present_documents(xp, rows.documents[:, 0::2])
    known = present > 0
    reference = as_float(xp, rows.values["reference_logps"])
    zero = xp.zeros_like(present)
    chosen = xp.where(known, logps[:, 0::2] - reference[:, 0::2], zero)
    rejected = xp.where(known, logps[:, 1::2] - reference[:, 1::2], zero)
    beta = float(settings["dpo_beta"])
    if settings["dpo_loss"] == "ipo":
        chosen_tokens = xp.maximum(counts[:, 0::2], xp.ones_like(present))
        rejected_tokens = xp.maximum(counts[:, 1::2], xp.ones_like(present))
        delta = chosen / chosen_tokens - rejected / rejected_tokens
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        losses = softplus(xp, -beta * (chosen - rejected))
    reward_c, reward_r = beta * chosen, beta * rejected
    pairs = xp.sum(present)
    per_pair = {
        "rewards/chosen": reward_c,
        "rewards/rejected": reward_r,
        "rewards/margins": reward_c - reward_r,
        "rewards/accuracies": as_float(xp, reward_c > reward_r),
        "logps/chosen": logps[:, 0::2],
        "logps/rejected": logps[:, 1::2],
    }
    metrics = {name: (xp.sum(value * present), pairs) for name, value in per_pair.items()}
    return LossTerms(total=xp.sum(losses * present), metrics=metrics)


DPO = Objective(
    name="dpo",
    summary="TRL's DPO over preference pairs, against a reference model's "
    "log-probabilities computed once",
    data=DataKind.PAIRS,
    loss=dpo_loss,
    items=pair_count,
    item_name="pairs",
    settings=(
        Setting(
            "dpo_beta",
            float,
            0.1,
            "DPO's beta: how far the policy may move from the reference",
            above=0,
        ),
        Setting("dpo_loss", str, "sigmoid", "DPO's loss: sigmoid or ipo", choices=DPO_LOSSES),
        REFERENCE,
    ),
    reference=ReferenceUse.STORED,
    document_values=("reference_logps",),
    metrics=DPO_METRICS,
    console_keys=("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"),
    changeable=frozenset({"reference"}),
)
