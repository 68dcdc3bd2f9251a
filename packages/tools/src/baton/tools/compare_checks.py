"""The checks ``baton compare`` makes of its backends and objective before anything is
prepared: known backends with their recipes, data given with its tokenizer, and every
backend declaring the objective (past pretraining, with a recipe that takes
``--objective``); each a ``ValueError`` naming the problem and the choices.

Example::

    from pathlib import Path
    from baton.tools.compare_checks import check_arguments, check_objective

    check_arguments(("fabric", "megatron"), None, None, Path("recipes"))   # passes
    check_objective(("fabric", "lightning"), "sft", Path("recipes"))
    # ValueError: --objective sft: lightning does not train it (...); choose from ...
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from baton.core.backend_descriptor import backend_descriptors
from baton.core.objectives import DataKind, objective_named
from baton.tools.compare_backends import compared, objective_backends, takes_objective


def check_arguments(
    backends: Sequence[str], data_path: str | None, tokenizer: str | None, recipes: Path
) -> None:
    """``ValueError`` for unknown backends, data without its tokenizer, missing recipes."""
    runs = compared()
    unknown = [b for b in backends if b not in runs]
    if unknown or not backends:
        raise ValueError(
            f"--backends {' '.join(backends) or '(none)'}: choose from {' '.join(runs)}"
        )
    if (data_path is None) != (tokenizer is None):
        raise ValueError(
            "pass both --data-path (a `baton data prepare` prefix) and --tokenizer (the "
            "directory it was prepared with), or neither to prepare the Python reference"
        )
    missing = [runs[b].recipe for b in backends if not (recipes / runs[b].recipe).is_file()]
    if missing:
        raise ValueError(
            f"--recipes {recipes} lacks {', '.join(missing)}; run from the project's root "
            "or pass --recipes PATH/TO/recipes"
        )


def check_posttrain(
    backends: Sequence[str],
    objective: str,
    data_path: str | None,
    tokenizer: str | None,
    recipes: Path,
) -> None:
    """``ValueError`` for a post-training comparison without its data and their tokenizer,
    or on a backend whose recipe has no ``--objective``."""
    if data_path is None or tokenizer is None:
        kind = objective_named(objective).data
        made = "" if kind == DataKind.PROMPTS else " --seq-len"
        raise ValueError(
            f"--objective {objective} needs --data-path ({kind.described}: a .jsonl/.parquet, "
            f"or a prefix from `baton data prepare{made}`) and --tokenizer (with its chat "
            "template)"
        )
    runs = compared()
    without = [b for b in backends if not takes_objective(recipes / runs[b].recipe)]
    if without:
        raise ValueError(
            f"--objective {objective}: the recipe of {' '.join(without)} has no --objective; "
            f"choose from {' '.join(objective_backends(objective, recipes)) or '(none)'}"
        )


def check_objective(backends: Sequence[str], objective: str, recipes: Path) -> None:
    """``ValueError`` for a backend whose descriptor does not name ``objective``."""
    declared = {d.name: d.objectives for d in backend_descriptors()}
    others = [b for b in backends if objective not in declared[b]]
    if others:
        raise ValueError(
            f"--objective {objective}: {' '.join(others)} does not train it (its backend "
            f"declares {', '.join(declared[others[0]])}); choose from "
            f"{' '.join(objective_backends(objective, recipes)) or '(none)'}"
        )
