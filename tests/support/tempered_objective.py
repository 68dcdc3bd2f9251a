"""A test objective that reads what only the logits give: the negative log-likelihood of
the supervised targets at a temperature (``logits / T`` before the log-softmax), with the
mean entropy of the predicted distributions as a metric. An engine runs it from its
declaration alone, so a test checks that the engine's log-probabilities honour
``Objective.temperature`` and that its entropy (over tensor-parallel vocabulary shards
too) is the full distribution's::

    --objective tests/support/tempered_objective.py:TEMPERED --tempered-temperature 0.7

or, registered first (``OBJECTIVES``), ``--objective tempered``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.objectives import DataKind, LossInputs, LossTerms, Objective, Setting
from baton.core.objectives.sft import supervised_tokens


def tempered_loss(xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms:
    """``-log p`` at the temperature summed over the supervised targets; the entropy's
    ``(sum, count)`` over them as ``tempered/entropy``."""
    mask = xp.astype(inputs.rows.mask, xp.float32)
    assert inputs.entropy is not None, "the objective declares entropy=True"
    return LossTerms(
        total=-xp.sum(inputs.logps * mask),
        metrics={"tempered/entropy": (xp.sum(inputs.entropy * mask), xp.sum(mask))},
    )


TEMPERED = Objective(
    name="tempered",
    summary="the negative log-likelihood of the supervised tokens at a temperature",
    data=DataKind.CONVERSATIONS,
    loss=tempered_loss,
    items=supervised_tokens,
    settings=(
        Setting("tempered_temperature", float, 0.7, "what the logits are divided by", above=0),
    ),
    temperature="tempered_temperature",
    entropy=True,
    metrics=("tempered/entropy",),
)
