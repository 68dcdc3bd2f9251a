"""Supervised fine-tuning: the mean negative log-likelihood of the supervised tokens of
prepared conversations (the assistant's turns by default), over the global batch.

Every engine may run its own fused cross entropy for it (``native_cross_entropy``): the
loss mask is its loss mask, packed documents its own document inputs. ``loss`` below is
the same quantity from per-token log-probabilities, for engines and tests that need it.

Example::

    run = ObjectiveRun.of("sft")
    terms = run.loss(xp, LossInputs(rows, logps))     # total: -sum of masked log-probs
    loss = terms.total / run.items(xp, rows)           # one micro-batch alone
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.objectives.array_math import as_float
from baton.core.objectives.declaration import (
    DataKind,
    LossInputs,
    LossTerms,
    Objective,
    Rows,
)


def negative_log_likelihood(xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms:
    """The sum of ``-log p`` over the supervised targets."""
    mask = as_float(xp, inputs.rows.mask)
    return LossTerms(total=-xp.sum(inputs.logps * mask))


def supervised_tokens(xp: Any, rows: Rows, settings: Mapping[str, Any]) -> Any:
    """The number of supervised targets."""
    return xp.sum(as_float(xp, rows.mask))


SFT = Objective(
    name="sft",
    summary="the mean negative log-likelihood of the supervised tokens of prepared conversations",
    data=DataKind.CONVERSATIONS,
    loss=negative_log_likelihood,
    items=supervised_tokens,
    native_cross_entropy=True,
)
