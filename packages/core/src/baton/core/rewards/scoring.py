"""Every reward function called on a step's completions, its values checked.

Example::

    from baton.core.rewards.scoring import score

    table = score(rewards, prompts, completions, completion_ids, {"answer": answers})
    table.names, table.weights          # ("accuracy", "format"), (1.0, 0.2)
    table.rows[0]                       # (1.0, 0.0): completion 0's value of each function
    table.values("accuracy")            # [1.0, 0.0, None, ...] (None: it could not score one)

A reward function that raises, returns another number of values than completions, NaN,
an infinity or something that is not a number is a ``UsageError`` naming the function,
the prompt and the fix (one line, exit status 2). None is a value: the completion is
unscorable by that function (TRL's NaN).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from baton.core.errors import UsageError
from baton.core.rewards.answers import completion_text
from baton.core.rewards.function import Reward


@dataclass(frozen=True)
class RewardTable:
    """Each reward function's value for each completion: ``rows[i][f]`` is function ``f``'s
    value of completion ``i`` (None: unscorable), ``weights[f]`` its weight."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    rows: tuple[tuple[float | None, ...], ...]

    def __len__(self) -> int:
        return len(self.rows)

    def values(self, name: str) -> list[float | None]:
        """Function ``name``'s value of every completion."""
        column = self.names.index(name)
        return [row[column] for row in self.rows]

    def row(self, index: int) -> dict[str, float | None]:
        """``{function name: value}`` of completion ``index``."""
        return dict(zip(self.names, self.rows[index], strict=True))


def _prompt_words(prompt: Any, width: int = 60) -> str:
    """A prompt on one short line: text, or the content of its last turn."""
    if isinstance(prompt, list) and prompt:
        last: Any = cast(list[Any], prompt)[-1]
        content = (
            cast(Mapping[str, Any], last).get("content") if isinstance(last, Mapping) else last
        )
        text = str(content or "")
    else:
        text = completion_text(prompt)
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _first_failure(
    reward: Reward,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
) -> tuple[int, BaseException] | None:
    """The first completion the function raises on alone, and its error."""
    for i in range(len(prompts)):
        try:
            reward(
                prompts[i : i + 1],
                completions[i : i + 1],
                completion_ids[i : i + 1],
                {k: v[i : i + 1] for k, v in columns.items()},
            )
        except Exception as error:
            return i, error
    return None


def _value(reward: Reward, value: Any, index: int, prompt: Any) -> float | None:
    if value is None:
        return None
    where = f"completion {index} (prompt {_prompt_words(prompt)})"
    if not isinstance(value, numbers.Real):
        raise UsageError(
            f"{reward.source}: {reward.name} returned {value!r} ({type(value).__name__}) for "
            f"{where}, not a number; return a float, or None for a completion it cannot score"
        )
    number = float(value)
    if math.isnan(number):
        raise UsageError(
            f"{reward.source}: {reward.name} returned NaN for {where}; return None for a "
            "completion it cannot score"
        )
    if math.isinf(number):
        raise UsageError(
            f"{reward.source}: {reward.name} returned {number} for {where}; return a finite number"
        )
    return number


def _call(
    reward: Reward,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
) -> list[float | None]:
    try:
        values = reward(prompts, completions, completion_ids, columns)
    except Exception as error:
        found = _first_failure(reward, prompts, completions, completion_ids, columns)
        index, raised = found if found is not None else (0, error)
        message = str(raised).splitlines()[0] if str(raised).strip() else ""
        raise UsageError(
            f"{reward.source}: {reward.name} raised {type(raised).__name__}"
            f"{': ' + message if message else ''} on prompt {_prompt_words(prompts[index])}; "
            "fix the reward function, or return None for a completion it cannot score"
        ) from error
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
        kind = type(cast(object, values)).__name__
        raise UsageError(
            f"{reward.source}: {reward.name} returned a {kind}, not a list; return one number "
            "(or None) per completion"
        )
    returned = cast(Sequence[Any], values)
    if len(returned) != len(prompts):
        raise UsageError(
            f"{reward.source}: {reward.name} returned {len(returned)} values for "
            f"{len(prompts)} completions; return one per completion (None for one it cannot "
            "score)"
        )
    return [_value(reward, v, i, prompts[i]) for i, v in enumerate(returned)]


def score(
    rewards: Sequence[Reward],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
) -> RewardTable:
    """Call each reward function once on all the completions (as TRL does) and check what
    it returns. ``prompts[i]``, ``completions[i]``, ``completion_ids[i]`` and each column's
    ``[i]`` belong to completion ``i``."""
    count = len(prompts)
    lengths = {"completions": len(completions), "completion_ids": len(completion_ids)}
    lengths |= {f"column {k!r}": len(v) for k, v in columns.items()}
    wrong = {what: n for what, n in lengths.items() if n != count}
    if wrong:
        raise ValueError(f"{count} prompts but {wrong}: give one of each per completion")
    if not rewards:
        raise UsageError("no reward function; give one with --reward NAME (`baton rewards`)")
    by_function = [_call(r, prompts, completions, completion_ids, columns) for r in rewards]
    rows = tuple(zip(*by_function, strict=True)) if count else ()
    return RewardTable(
        tuple(r.name for r in rewards), tuple(float(r.weight) for r in rewards), rows
    )
