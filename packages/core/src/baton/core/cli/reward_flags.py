"""``--reward`` and ``--reward-weights``: reward functions named on the command line.

The same rules as ``--callback`` (``cli/callback_flags.py``, ``callback_paths.py``): a
registered name (``baton rewards`` lists them), a file's function or a module's, each
with ``:key=value,...`` settings typed from the function's keyword-only parameters::

    rewards = load_rewards(
        ["accuracy:mode=numeric", "rewards.py:my_reward:scale=2", "mypkg.rewards:fn"],
        weights="1.0,0.5,0.5",
    )
    rewards[0].name, rewards[0].settings, rewards[0].weight   # "accuracy", {"mode": "numeric"}, 1.0
    rewards[1].spec                  # "/home/me/exp/rewards.py:my_reward" (resolved: resumable)
    records = [reward_record(r) for r in rewards]   # {"name": "/home/me/...", "weight": 0.5, ...}
    rewards_from_records(records, "checkpoint")        # the same rewards again (a resume)

Every mistake is one ``UsageError`` line naming the flag and the fix: an unknown name
(with the closest), a missing file or module, a name that is no function, an unknown,
mistyped or missing setting, a setting its function's check refuses, weights that are not
one number per reward.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from baton.core.callback_paths import (
    PathKind,
    class_label,
    load_module,
    names_class,
    normal_name,
)
from baton.core.cli.callback_flags import (
    CallbackChoice,
    parse_choice,
    settings_signature,
    split_top_level,
    typed_arguments,
)
from baton.core.errors import UsageError, did_you_mean
from baton.core.json_values import json_value
from baton.core.registry import REWARDS, UnknownNameError
from baton.core.rewards.builtins import BUILT_IN
from baton.core.rewards.function import Reward

#: a reward function: ``--reward FILE.py:function``
REWARD_PATH = PathKind(
    "--reward",
    "reward",
    "accuracy",
    "function",
    "function",
    "mypkg.rewards:my_reward",
    "rewards.py:my_reward",
    REWARDS,
)


def parse_reward_flag(text: str) -> CallbackChoice:
    """``NAME[:key=value,...]``, ``FILE.py:fn[:...]`` or ``module:fn[:...]`` as given to
    ``--reward``: the name (a path resolved) and the settings, not yet typed."""
    return parse_choice(text, REWARD_PATH)


def registered_rewards() -> list[tuple[str, Callable[..., Any]]]:
    """Every registered reward function by name: the built-in ones (:data:`BUILT_IN`) and
    the plugins'."""
    return list(REWARDS.items())


def reward_function(name: str, source: str) -> Callable[..., Any]:
    """The function a registered name or a path (``FILE.py:fn``, ``module:fn``) names, or
    a one-line ``UsageError``."""
    if names_class(name):
        return _function_at(name, source)
    try:
        return REWARDS.get(name)
    except UnknownNameError:
        close = did_you_mean(name, REWARDS.names())
        if close is not None:
            raise UsageError(
                f"{source}: unknown reward {name!r}; did you mean {close!r}? "
                "(`baton rewards` lists them)"
            ) from None
        raise UsageError(
            f"{source}: unknown reward {name!r}; registered rewards: "
            f"{', '.join(REWARDS.names())} (or a function of your own: --reward "
            "rewards.py:my_reward)"
        ) from None


def _function_at(target: str, source: str) -> Callable[..., Any]:
    where, _, name = target.rpartition(":")
    module = load_module(target, source, REWARD_PATH)
    found = getattr(module, name, None)
    if found is None:
        own = [
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        ]
        close = did_you_mean(name, own)
        hint = (
            f"did you mean {close!r}?"
            if close
            else f"its functions: {', '.join(own)}"
            if own
            else "define the reward function there"
        )
        raise UsageError(f"{source}: {where} defines no function {name!r}; {hint}")
    if isinstance(found, type) or not callable(found):
        raise UsageError(
            f"{source}: {where}:{name} is a {type(found).__name__}, not a function; name a "
            "function f(prompts, completions, completion_ids, **columns)"
        )
    return cast(Callable[..., Any], found)


def _function_name(spec: str, function: Callable[..., Any]) -> str:
    if not names_class(spec):
        return spec
    return str(getattr(function, "__name__", None) or class_label(spec))


def build_reward(choice: CallbackChoice, weight: float = 1.0) -> Reward:
    """The reward ``choice`` names, its settings typed and checked, with ``weight``."""
    function = reward_function(choice.name, choice.source)
    settings = typed_arguments(choice, settings_signature(function).params)
    check = getattr(function, "check_settings", None)
    if check is not None:
        try:
            check(**settings)
        except (ValueError, TypeError) as error:
            raise UsageError(f"{choice.source}: {error}") from None
    name = _function_name(choice.name, function)
    return Reward(name, function, settings, weight, choice.source, choice.name)


def parse_reward_weights(weights: str | Sequence[float] | None, count: int) -> tuple[float, ...]:
    """One weight per reward: ``"1.0,0.5"`` or ``[1.0, 0.5]``; None gives 1.0 each."""
    if weights is None:
        return (1.0,) * count
    texts = split_top_level(weights) if isinstance(weights, str) else list(weights)
    values: list[float] = []
    for text in texts:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise UsageError(
                f"--reward-weights: {text!r} is not a number; give one number per --reward, "
                "e.g. --reward-weights 1.0 0.5"
            ) from None
        if not math.isfinite(value):
            raise UsageError(f"--reward-weights: {text!r} is not a finite number")
        values.append(value)
    if len(values) != count:
        raise UsageError(
            f"--reward-weights gives {len(values)} weights for {count} rewards; give one per "
            "--reward, in their order"
        )
    return tuple(values)


def _named_apart(rewards: list[Reward]) -> list[Reward]:
    """Rewards of one name told apart: the second ``format`` is ``format_2``."""
    seen: dict[str, int] = {}
    named: list[Reward] = []
    for reward in rewards:
        seen[reward.name] = seen.get(reward.name, 0) + 1
        if seen[reward.name] > 1:
            reward = dataclasses.replace(reward, name=f"{reward.name}_{seen[reward.name]}")
        named.append(reward)
    return named


def load_rewards(
    specs: Sequence[str | CallbackChoice], weights: str | Sequence[float] | None = None
) -> list[Reward]:
    """The rewards ``--reward`` flags (or choices read from a config file) name, weighted
    by ``--reward-weights``; a ``UsageError`` for none given."""
    if not specs:
        raise UsageError(
            "GRPO needs a reward: give --reward NAME (`baton rewards` lists them) or "
            "--reward rewards.py:my_reward"
        )
    values = parse_reward_weights(weights, len(specs))
    choices = [parse_reward_flag(s) if isinstance(s, str) else s for s in specs]
    return _named_apart([build_reward(c, w) for c, w in zip(choices, values, strict=True)])


def reward_record(reward: Reward) -> dict[str, Any]:
    """What the settings and checkpoints record of a reward: how it was named (a path
    resolved), its weight and every setting (given or default)."""
    record: dict[str, Any] = {"name": reward.spec or reward.name, "weight": reward.weight}
    for param in settings_signature(reward.function).params:
        value = reward.settings.get(param.name, param.default)
        if value is not dataclasses.MISSING:
            record[param.name] = json_value(value)
    return record


def rewards_from_records(records: Sequence[Mapping[str, Any]], source: str) -> list[Reward]:
    """The rewards :func:`reward_record` recorded, built again (a resume)."""
    built: list[Reward] = []
    for record in records:
        name = normal_name(str(record["name"]), source, REWARD_PATH)
        settings = {str(k): v for k, v in record.items() if k not in ("name", "weight")}
        where = f"{source}: reward {class_label(name)}"
        choice = CallbackChoice(name, settings, source=where, from_text=False)
        built.append(build_reward(choice, float(record.get("weight", 1.0))))
    return _named_apart(built)


__all__ = [
    "BUILT_IN",
    "REWARD_PATH",
    "build_reward",
    "load_rewards",
    "parse_reward_flag",
    "parse_reward_weights",
    "registered_rewards",
    "reward_function",
    "reward_record",
    "rewards_from_records",
]
