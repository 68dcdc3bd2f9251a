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
