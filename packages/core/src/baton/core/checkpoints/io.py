"""A backend's checkpoint I/O: the part that saves, loads and reports the facts core
records, built from the state it needs.

The step engine builds, steps and owns the training state; its checkpoint I/O reads
that state, writes the framework's native files and restores them. It is handed what
it works on (model parts, optimizers, the data loader's state, the layout), as
arguments or a small record, never the backend itself, and the backend hands
``save``, ``load``, ``checkpoint_facts``, ``plan_load`` and ``legacy_facts`` over to
it::

    class MyCheckpointIO:
        def __init__(self, model: Module, optimizer: Optimizer, data: Stream) -> None: ...

        def save(self, directory, *, asynchronous=False): ...   # a PendingSave or None
        def load(self, directory, plan=LOAD_ALL): ...
        def facts(self): return CheckpointFacts({"tp": 1}, self.data.samples, "")
        def plan_load(self, saved): return LoadPlan(refusal="...")   # LOAD_ALL: reshards
        def legacy_facts(self, directory): return None               # no older side file

    class MyBackend(BackendBase):
        def setup(self) -> None:
            ...
            self.checkpoints = MyCheckpointIO(self.model, self.optimizer, self.data)

        def save(self, directory, *, asynchronous=False):
            return self.checkpoints.save(directory, asynchronous=asynchronous)
        ...
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from baton.core.backend import PendingSave
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan


class CheckpointIO(Protocol):
    """One backend's checkpoints: its native files and the facts core records.

    ``save(directory, asynchronous=)`` writes the state under ``directory`` (the
    checkpoint's ``backend/``), returning a ``PendingSave`` when it goes on in the
    background; ``load(directory, plan)`` restores it as ``plan`` says. ``facts()``,
    ``plan_load(saved)`` and ``legacy_facts(directory)`` answer the backend's
    ``checkpoint_facts``, ``plan_load`` and ``legacy_facts``.
    """

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None: ...

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None: ...

    def facts(self) -> CheckpointFacts: ...

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan: ...

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None: ...


class UsesCheckpointIO[IO: CheckpointIO]:
    """A backend whose checkpoint I/O is ``self.checkpoints`` (of type ``IO``): its
    ``save``, ``load``, ``checkpoint_facts``, ``plan_load`` and ``legacy_facts`` hand
    over to it. Composed beside ``BackendBase``, which it precedes in the bases."""

    #: this backend's checkpoint I/O
    checkpoints: IO

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        """Write the native checkpoint under ``directory``; a handle when asynchronous."""
        return self.checkpoints.save(Path(directory), asynchronous=asynchronous)

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore what ``save`` wrote (weights, optimizer, data position, RNG)."""
        self.checkpoints.load(Path(directory), plan)

    def checkpoint_facts(self) -> CheckpointFacts:
        return self.checkpoints.facts()

    def plan_load(self, saved_layout: Mapping[str, Any]) -> LoadPlan:
        return self.checkpoints.plan_load(saved_layout)

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        return self.checkpoints.legacy_facts(directory)
