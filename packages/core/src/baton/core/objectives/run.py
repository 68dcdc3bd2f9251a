"""The objective a run trains: a declared ``Objective`` and the run's values of its
settings, checked once, before anything is built.

A recipe takes one parameter for it, ``objective: ObjectiveRun | str = "pretrain"``;
``baton run`` expands it into ``--objective NAME`` and every declared objective's settings
as flags (``baton.core.cli.objective_flags``) and hands the recipe an ``ObjectiveRun``.
Called from Python, a recipe may get a name instead: ``ObjectiveRun.of`` accepts both.

Example::

    run = ObjectiveRun.of("dpo", dpo_beta=0.2)
    run.name, run["dpo_beta"], run["dpo_loss"]     # "dpo", 0.2, "sigmoid"
    run.objective.data                             # DataKind.PAIRS
    run.reference_use                              # ReferenceUse.STORED
    run.settings()                                 # {"objective": "dpo", "dpo_beta": 0.2, ...}
    run.check_held_out(eval_split=0.1, eval_data_path=None)   # UsageError for GRPO only
    terms = run.loss(xp, inputs)                   # LossTerms(total, metrics)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from baton.core.errors import UsageError
from baton.core.objectives.declaration import (
    LossInputs,
    LossTerms,
    Objective,
    ReferenceUse,
    Rows,
)
from baton.core.objectives.registry import objective_named


@dataclass(frozen=True)
class ObjectiveRun:
    """An objective with the run's values of every one of its settings."""

    objective: Objective
    values: Mapping[str, Any]

    @classmethod
    def of(cls, choice: ObjectiveRun | Objective | str, **values: Any) -> ObjectiveRun:
        """The run of ``choice`` (a registered name, a declaration or a run) with
        ``values`` over its defaults; ``UsageError`` for an unknown name, a setting it
        does not have, or a value its checks refuse."""
        if isinstance(choice, ObjectiveRun):
            if not values:
                return choice
            choice, values = choice.objective, {**choice.values, **values}
        if isinstance(choice, str):
            choice = objective_named(choice)
        unknown = sorted(set(values) - {s.name for s in choice.settings})
        if unknown:
            flags = ", ".join("--" + name.replace("_", "-") for name in unknown)
            raise UsageError(
                f"{flags} is not a setting of --objective {choice.name}; drop it, or choose "
                "the objective it belongs to"
            )
        merged = choice.defaults() | values
        for setting in choice.settings:
            setting.check(merged[setting.name])
        problem = choice.check(merged) if choice.check is not None else None
        if problem:
            raise UsageError(problem)
        return cls(choice, merged)

    @property
    def name(self) -> str:
        return self.objective.name

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def reference_use(self) -> ReferenceUse:
        return self.objective.reference_use(self.values)

    @property
    def temperature(self) -> float:
        """What the logits are divided by before the log-softmax (1.0 unless declared)."""
        setting = self.objective.temperature
        return 1.0 if setting is None else float(self.values[setting])

    def settings(self) -> dict[str, Any]:
        """The run's objective and its settings, as a run records them."""
        return {"objective": self.name, **self.values}

    def check_held_out(self, *, eval_split: float, eval_data_path: str | None) -> None:
        """``UsageError`` (one line) when rows are to be held out for evaluation
        (``--eval-split``, ``--eval-data-path``) from an objective that samples its rows
        every step (``rollouts``): it has no prepared rows to hold out."""
        if not self.objective.rollouts or not (eval_split or eval_data_path is not None):
            return
        flag = "--eval-split" if eval_split else "--eval-data-path"
        raise UsageError(
            f"{flag}: --objective {self.name} samples its completions every step and holds "
            f"no rows out for evaluation; drop {flag}"
        )

    def loss(self, xp: Any, inputs: LossInputs) -> LossTerms:
        """The objective's loss on one micro-batch (see ``LossTerms``)."""
        return self.objective.loss(xp, inputs, self.values)

    def items(self, xp: Any, rows: Rows) -> Any:
        """What the loss is a mean over in ``rows`` (summed over the global batch)."""
        return self.objective.items(xp, rows, self.values)
