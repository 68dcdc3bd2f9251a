"""A recipe that takes an objective, over the pure-Python scalar backend: the objective's
flags come from the declarations (``baton run tests/core/recipe_objective.py --help``)."""

from __future__ import annotations

from baton.callbacks import Checkpoint
from baton.core import Driver
from baton.core.objectives import ObjectiveRun
from support.scalar_backend import ScalarBackend

#: what the last call of ``recipe`` was given (the tests read it)
SEEN: list[ObjectiveRun] = []


def recipe(run_dir: str, max_steps: int = 2, objective: ObjectiveRun | str = "pretrain") -> Driver:
    """Gradient descent on a scalar, recording the objective it was given.

    Args:
        run_dir: where the run writes.
        max_steps: optimizer steps.
        objective: what a step minimises.
    """
    run = ObjectiveRun.of(objective)
    SEEN.append(run)
    return Driver(
        ScalarBackend(),
        [Checkpoint()],
        max_steps=max_steps,
        run_dir=run_dir,
        settings=run.settings(),
        training_settings=run.objective.fixed_on_resume,
    )
