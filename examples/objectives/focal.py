"""A focal-loss objective for supervised fine-tuning, declared once: every LLM engine
trains it through its own native step from this declaration alone.

The focal loss (Lin et al., 2017) down-weights the tokens the model already predicts
well: each supervised target contributes ``-(1 - p) ** gamma * log p`` instead of
``-log p``; ``gamma = 0`` is SFT's loss. It reads what every engine hands an objective,
the per-token log-probabilities of the targets and the loss mask, so it is written once
against the array API and runs on torch tensors and inside MaxText's jitted step alike::

    uv run baton run recipes/hf_finetune.py --objective examples/objectives/focal.py:FOCAL \\
        --focal-gamma 2 --init-from tiny-llama --data-path data/chat --tokenizer tok

The step's loss is the mean over the supervised tokens of the global batch
(``supervised_tokens``, SFT's count), whatever the engine's layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.objectives import DataKind, LossInputs, LossTerms, Objective, Setting
from baton.core.objectives.sft import supervised_tokens


def focal_loss(xp: Any, inputs: LossInputs, settings: Mapping[str, Any]) -> LossTerms:
    """The focal loss summed over the supervised targets, and the mean probability of
    the target (``focal/p``) as a metric."""
    mask = xp.astype(inputs.rows.mask, xp.float32)
    p = xp.exp(inputs.logps)
    weight = (1 - p) ** float(settings["focal_gamma"])
    return LossTerms(
        total=-xp.sum(weight * inputs.logps * mask),
        metrics={"focal/p": (xp.sum(p * mask), xp.sum(mask))},
    )


FOCAL = Objective(
    name="focal",
    summary="the focal loss over the supervised tokens of prepared conversations",
    data=DataKind.CONVERSATIONS,
    loss=focal_loss,
    items=supervised_tokens,
    settings=(
        Setting(
            "focal_gamma",
            float,
            2.0,
            "how much well-predicted tokens are down-weighted (0: SFT's loss)",
            at_least=0,
        ),
    ),
    metrics=("focal/p",),
    console_keys=("focal/p",),
)
