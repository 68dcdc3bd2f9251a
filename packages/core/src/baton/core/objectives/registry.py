"""The objectives baton knows by name: the four it ships and any a package registers.

Example::

    from baton.core.objectives import OBJECTIVES, objective_named, register_objective

    objective_named("dpo").data        # DataKind.PAIRS
    OBJECTIVES.names()                 # ['dpo', 'grpo', 'pretrain', 'sft', ...]
    register_objective(FOCAL)          # a package's own (its module imported by a plugin)
"""

from __future__ import annotations

from baton.core.errors import UsageError, did_you_mean
from baton.core.objectives.declaration import DataKind, Objective
from baton.core.objectives.dpo import DPO
from baton.core.objectives.grpo import GRPO
from baton.core.objectives.pretrain import PRETRAIN
from baton.core.objectives.sft import SFT
from baton.core.registry import Registry

OBJECTIVES: Registry[Objective] = Registry("objective")
#: the objectives baton ships, in the order messages prefer them
SHIPPED: tuple[Objective, ...] = (PRETRAIN, SFT, DPO, GRPO)
for _shipped in SHIPPED:
    OBJECTIVES.add(_shipped.name, _shipped)


def objective_reading(kind: DataKind) -> Objective | None:
    """The objective a message names for data of ``kind``: the shipped one that reads
    it, else any registered one that does (None: none)."""
    for objective in SHIPPED:
        if objective.data == kind:
            return objective
    for name in OBJECTIVES.names(plugins=False):
        if OBJECTIVES.get(name).data == kind:
            return OBJECTIVES.get(name)
    return None


def register_objective(objective: Objective) -> Objective:
    """Make ``objective`` known by its name (``--objective NAME``). Its settings may not
    redefine a setting another objective declares under the same name differently."""
    for other_name in OBJECTIVES.names():
        other = OBJECTIVES.get(other_name)
        if other.name == objective.name:
            continue
        for setting in objective.settings:
            theirs = next((s for s in other.settings if s.name == setting.name), None)
            if theirs is not None and theirs != setting:
                raise ValueError(
                    f"objective {objective.name!r} declares setting {setting.name!r} "
                    f"unlike objective {other.name!r}; share the Setting or rename it"
                )
    return OBJECTIVES.add(objective.name, objective)


def objective_named(name: str) -> Objective:
    """The objective registered as ``name``; ``UsageError`` naming the choices."""
    if name in OBJECTIVES:
        return OBJECTIVES.get(name)
    known = OBJECTIVES.names()
    close = did_you_mean(name, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    raise UsageError(f"--objective {name!r}{hint}: use one of {', '.join(known)}")
