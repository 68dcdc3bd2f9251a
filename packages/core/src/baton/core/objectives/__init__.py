"""Objectives, each declared once: what a step minimises, the data it reads, its
settings, its reference model, its metrics and its loss (``declaration.py``); the four
baton ships (``pretrain.py``, ``sft.py``, ``dpo.py``, ``grpo.py``); the run's choice with
its settings' values (``run.py``).

Example::

    from baton.core.objectives import ObjectiveRun

    run = ObjectiveRun.of("dpo", dpo_beta=0.2)
    run.objective.data, run.reference_use, run.objective.metrics
"""

from __future__ import annotations

from baton.core.objectives.declaration import (
    DataKind,
    ItemsFunction,
    LossFunction,
    LossInputs,
    LossTerms,
    Objective,
    ReferenceUse,
    Rows,
    Setting,
)
from baton.core.objectives.registry import OBJECTIVES, objective_named, register_objective
from baton.core.objectives.run import ObjectiveRun

__all__ = [
    "OBJECTIVES",
    "DataKind",
    "ItemsFunction",
    "LossFunction",
    "LossInputs",
    "LossTerms",
    "Objective",
    "ObjectiveRun",
    "ReferenceUse",
    "Rows",
    "Setting",
    "objective_named",
    "register_objective",
]
