"""Core's record of a backend's checkpoint: the facts it depends on, and how it loads.

Beside its native files, a checkpoint depends on facts only the backend knows: the
parallel layout it was written on, where its data stood (in one unit for every
backend: global samples consumed) and which data it was (a fingerprint). A backend
reports them in ``Backend.checkpoint_facts()``; ``CheckpointSaver`` records them in
``baton.json`` under ``"checkpoint"``, and before the backend loads anything the
resume compares them with this run's (``baton.core.checkpoints.compatibility``)::

    facts = backend.checkpoint_facts()
    # CheckpointFacts(layout={"tp": 2, "pp": 1}, samples=800, data="3f2a...")
    meta["checkpoint"] = facts.to_json()

A layout that differs is not refused by itself: the backend's ``plan_load(saved_layout)``
says how its framework loads it (a ``LoadPlan``: what is left fresh), or why it cannot;
``load`` is then handed that plan::

    plan = backend.plan_load({"tp": 2, "pp": 1})
    # LoadPlan(fresh=frozenset({"rng"}), note="model-parallel shards differ: ...")
    backend.load(directory, plan)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

#: the key of the record in ``baton.json``
RECORD_KEY = "checkpoint"

#: saved state a load may leave as this run built it: the data position, the random state
FreshPart = Literal["data", "rng"]


@dataclass(frozen=True)
class CheckpointFacts:
    """What a checkpoint depends on beside its native files.

    Args:
        layout: the parallel layout it is written on, JSON-ready (``{"tp": 2, "pp": 1}``).
        samples: the data position: training samples consumed, over every rank together.
        data: the training data's fingerprint (``""``: the backend cannot tell).
    """

    layout: Mapping[str, Any] = field(default_factory=dict[str, Any])
    samples: int = 0
    data: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"layout": dict(self.layout), "samples": self.samples, "data": self.data}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CheckpointFacts:
        layout = cast(Mapping[str, Any], value.get("layout") or {})
        return cls(dict(layout), int(value.get("samples", 0)), str(value.get("data") or ""))


@dataclass(frozen=True)
class LoadPlan:
    """How this run loads one checkpoint, decided before anything is read.

    Args:
        refusal: why the checkpoint cannot load here and what to do (``None``: it loads).
        fresh: saved state the load leaves as this run built it: ``"data"`` (the data
            position does not move onto this layout: the data starts over), ``"rng"``
            (the random state belongs to other shards).
        note: what a reader of the log is told about the plan (``""``: nothing).

    >>> LoadPlan().loads_everything
    True
    >>> LoadPlan(fresh=frozenset({"data"})).loads_everything
    False
    """

    refusal: str | None = None
    fresh: frozenset[FreshPart] = frozenset()
    note: str = ""

    @property
    def loads_everything(self) -> bool:
        return self.refusal is None and not self.fresh


#: the plan of a checkpoint written on this run's layout: everything loads
LOAD_ALL = LoadPlan()


def show_layout(layout: Mapping[str, Any], order: Mapping[str, Any] | None = None) -> str:
    """``tp=2, pp=1`` (``(none)`` for an empty layout), keys in ``order``'s order first
    (``baton.json`` sorts its keys; the backend's own order reads better).

    >>> show_layout({"pp": 1, "tp": 2}, order={"tp": 1, "pp": 1})
    'tp=2, pp=1'
    """
    keys = [k for k in (order or {}) if k in layout] + [k for k in layout if k not in (order or {})]
    return ", ".join(f"{key}={layout[key]}" for key in keys) or "(none)"
