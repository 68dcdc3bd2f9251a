"""The built-in reward functions: ``accuracy``, ``format`` and ``length``.

Example::

    baton run recipes/grpo.py --reward accuracy:mode=numeric --reward format --reward-weights 1,0.2
    baton run recipes/grpo.py --reward length:target=64

Each has TRL's signature and takes its settings as keyword-only parameters
(``--reward NAME:key=value,...``); ``baton rewards NAME`` lists them.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Literal

from baton.core.registry import register_reward
from baton.core.rewards.answers import HOWS, completion_text, final_answer, read_number, same_text
from baton.core.rewards.function import checks_settings

#: the built-in reward functions (imported, they are registered)
BUILT_IN = ("accuracy", "format", "length")
#: ``format``'s default: reasoning in ``<think>`` tags, then the answer in ``<answer>`` tags
THINK_ANSWER = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def _check_accuracy(*, tolerance: float = 1e-6, **_: Any) -> None:
    if not tolerance >= 0:
        raise ValueError(f"tolerance is {tolerance}; give a number at least 0")


@register_reward("accuracy")
@checks_settings(_check_accuracy)
def accuracy(
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    *,
    column: str = "answer",
    mode: Literal["exact", "numeric"] = "exact",
    how: Literal["auto", "answer_tag", "boxed", "last", "whole"] = "auto",
    tolerance: float = 1e-6,
    ignore_case: bool = False,
    **columns: Any,
) -> list[float | None]:
    """1.0 where the completion's final answer matches the prompt's reference, else 0.0.

    The final answer (``how="auto"``) is the content of the completion's last
    ``<answer>...</answer>``, else of its last ``\\boxed{...}``, else its last number
    (``numeric``) or last non-empty line (``exact``); no answer found scores 0.0. The
    reference is the prompt's ``column`` value. ``exact``: equal text once whitespace runs
    are one space and the ends stripped. ``numeric``: both read as numbers (``$1,250``,
    ``3/4``, ``\\frac{3}{4}``, ``50%`` = 50; else the last number in the text, so
    ``#### 72`` is 72) and equal within ``tolerance`` (absolute or relative). A reference
    that is null, or not a number in ``numeric`` mode, cannot be scored: None.

    Args:
        column: the prompts' column that holds the reference answer.
        mode: exact (text) or numeric comparison.
        how: where the final answer is: auto, answer_tag, boxed, last (number or line), whole.
        tolerance: numeric mode: the absolute or relative difference still counted equal.
        ignore_case: exact mode: compare case-insensitively.
    """
    if column not in columns:
        have = ", ".join(sorted(columns)) or "none"
        raise ValueError(
            f"the prompts have no column {column!r} (their columns: {have}); pass "
            f"--reward accuracy:column=NAME"
        )
    numeric = mode == "numeric"
    scores: list[float | None] = []
    for completion, reference in zip(completions, columns[column], strict=True):
        if reference is None:
            scores.append(None)
            continue
        answer = final_answer(completion_text(completion), how, numeric=numeric)
        if not numeric:
            scores.append(
                float(answer is not None and same_text(answer, str(reference), ignore_case))
            )
            continue
        wanted = reference if isinstance(reference, int | float) else read_number(str(reference))
        if wanted is None or isinstance(wanted, bool) or not math.isfinite(wanted):
            scores.append(None)
            continue
        got = None if answer is None else read_number(answer)
        close = got is not None and math.isclose(got, wanted, rel_tol=tolerance, abs_tol=tolerance)
        scores.append(float(close))
    return scores


@functools.lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as error:
        raise ValueError(f"pattern {pattern!r} is not a regular expression ({error})") from None


def _check_format(*, pattern: str = THINK_ANSWER, **_: Any) -> None:
    _compiled(pattern)


@register_reward("format")
@checks_settings(_check_format)
def format_reward(
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    *,
    pattern: str = THINK_ANSWER,
    **columns: Any,
) -> list[float]:
    """1.0 where the completion's text matches ``pattern``, else 0.0.

    ``re.search`` with ``re.DOTALL`` (``.`` spans lines): anchor the pattern with ``^`` and
    ``$`` to match the whole completion. The default,
    ``^<think>.*?</think>\\s*<answer>.*?</answer>\\s*$``, asks for reasoning in ``<think>``
    tags then the answer in ``<answer>`` tags, and nothing else.

    Args:
        pattern: the regular expression a well-formed completion matches.
    """
    compiled = _compiled(pattern)
    return [float(compiled.search(completion_text(c)) is not None) for c in completions]


def _check_length(*, target: int, **_: Any) -> None:
    if target < 1:
        raise ValueError(f"target is {target}; give a length of at least 1 token")


@register_reward("length")
@checks_settings(_check_length)
def length(
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    *,
    target: int,
    **columns: Any,
) -> list[float]:
    """``-|n - target| / target`` for a completion of ``n`` tokens: 0.0 at the target,
    -1.0 for no token or twice the target, falling linearly on either side.

    ``n`` counts the completion's ids, its end-of-sequence token included where it
    generated one.

    Args:
        target: the completion length rewarded most, in tokens.
    """
    return [-abs(len(ids) - target) / target for ids in completion_ids]


__all__ = ["BUILT_IN", "HOWS", "THINK_ANSWER", "accuracy", "format_reward", "length"]
