"""The reward a GRPO parity test names on the command line: each completion's reward as
the fixed rollouts file records it (``support.grpo``)::

    --reward tests/support/grpo_rewards.py:recorded:path=/tmp/x/rollouts.jsonl
"""

from __future__ import annotations

from typing import Any

from support.grpo import recorded_reward


def recorded(
    prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], *, path: str,
    **columns: Any,
) -> list[float | None]:  # fmt: skip
    """The recorded reward of each completion (TRL's reward signature)."""
    return recorded_reward(prompts, completions, completion_ids, path=path, **columns)


#: the letters :func:`vowel_start` rewards words for starting with
VOWELS = "aeiou"


def vowel_start(
    prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **columns: Any
) -> list[float | None]:
    """The fraction of a completion's words that start with a vowel (0 without words):
    a dense reward a tiny random policy learns within a few dozen GRPO steps on a CPU
    (TRL's GRPOTrainer takes the mean reward from about 0.2 to 0.4-0.55 in 20 steps at a
    learning rate of 5e-3, 2 prompts x 8 completions of 8 tokens a step)."""
    del prompts, completion_ids, columns
    out: list[float | None] = []
    for completion in completions:
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        words = text.split()
        out.append(sum(w[0].lower() in VOWELS for w in words) / len(words) if words else 0.0)
    return out
