"""A reward function's signature (TRL's), and a reward as a run uses it: named, its
settings bound, weighted.

Example::

    from baton.core.rewards.function import Reward

    def brevity(prompts, completions, completion_ids, *, limit: int = 8, **columns):
        return [1.0 if len(ids) <= limit else 0.0 for ids in completion_ids]

    reward = Reward("brevity", brevity, {"limit": 4}, weight=0.5)
    reward(["2+2="], ["4"], [[19, 0]], {"answer": ["4"]})     # [1.0]
    reward.check_columns(["answer"])                           # UsageError if it needs others
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from baton.core.errors import UsageError

#: what every reward function is given by name, beside the prompts' columns
ARGUMENTS = ("prompts", "completions", "completion_ids")


class RewardFunction(Protocol):
    """TRL's reward function: one value per completion, None where it cannot score one.

    ``prompts[i]``, ``completions[i]`` and ``completion_ids[i]`` belong to completion
    ``i``; ``columns`` are the prompts' other fields, one value per completion (a prompt's
    value repeated for each of its completions). Settings are keyword-only parameters.
    """

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        **columns: Any,
    ) -> Sequence[float | None]: ...


def checks_settings[F: Callable[..., Any]](check: Callable[..., None]) -> Callable[[F], F]:
    """Decorator: ``check(**settings)`` runs when the reward is built from a command line
    (a ``ValueError`` there is the flag's error, before anything else runs)."""

    def decorate(function: F) -> F:
        function.__dict__["check_settings"] = check
        return function

    return decorate


@dataclass(frozen=True)
class Reward:
    """A reward function as a run calls it: ``name`` (the metric key
    ``rewards/<name>/mean``), its bound ``settings``, ``weight`` in the sum, and where it
    was given (``source``, for messages)."""

    name: str
    function: Callable[..., Any]
    settings: Mapping[str, Any] = field(default_factory=dict[str, Any])
    weight: float = 1.0
    source: str = ""
    #: how it was named (a registered name, or ``/abs/file.py:fn``, ``module:fn``)
    spec: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", f"--reward {self.spec or self.name}")

    def _parameters(self) -> tuple[dict[str, inspect.Parameter], bool]:
        parameters = dict(inspect.signature(self.function).parameters)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        return parameters, takes_any

    def required_columns(self) -> list[str]:
        """The columns the function names without a default (not its settings)."""
        parameters, _ = self._parameters()
        return [
            name
            for name, p in parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)
            and p.default is p.empty
            and name not in ARGUMENTS
            and name not in self.settings
        ]

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise ``UsageError`` if the function needs a column the prompts lack."""
        missing = [name for name in self.required_columns() if name not in columns]
        if missing:
            have = ", ".join(columns) or "none"
            raise UsageError(
                f"{self.source}: {self.name} takes the column {missing[0]!r}, which the "
                f"prompts lack (their columns: {have}); add it to the prompt records, or "
                "give the parameter a default"
            )

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Sequence[Any]],
    ) -> Any:
        """The function's values for these completions: called by keyword as TRL calls it
        (a function without ``**kwargs`` gets only the columns it names; a setting hides
        a column of its name)."""
        parameters, takes_any = self._parameters()
        given = {
            "prompts": list(prompts),
            "completions": list(completions),
            "completion_ids": [list(ids) for ids in completion_ids],
        }
        given |= {k: list(v) for k, v in columns.items() if k not in self.settings}
        if not takes_any:
            given = {k: v for k, v in given.items() if k in parameters}
        return self.function(**given, **self.settings)
