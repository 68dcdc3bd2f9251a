"""A backend's checkpoint I/O: one object per backend that saves, loads and reports
the facts core records, and the base that hands the backend's methods over to it.

The step engine builds, steps and owns the training state; its checkpoint I/O (a
``CheckpointIO``, built by the engine and kept as ``self.checkpoints``) reads that
state, writes the framework's native files and restores them. A backend that
inherits ``UsesCheckpointIO`` gets the ``Backend`` protocol's ``save`` and ``load`` and
the ``RecordsCheckpoint`` methods (``checkpoint_facts``, ``layout_refusal``,
``legacy_facts``) from it, each handing over to ``self.checkpoints``::

    class MyCheckpointIO:
        def __init__(self, engine: MyBackend) -> None:
            self.engine = engine

        def save(self, directory, *, asynchronous=False): ...   # a PendingSave or None
        def load(self, directory): ...
        def facts(self): return CheckpointFacts({"tp": 1}, self.engine.samples, "")
        def layout_refusal(self, saved): return "..."           # None: reshards
        def legacy_facts(self, directory): return None           # no older side file

    class MyBackend(UsesCheckpointIO[MyCheckpointIO], BackendBase):
        def __init__(self) -> None:
            self.checkpoints = MyCheckpointIO(self)

A backend that must do more around a load (forget an iterator over the restored data)
overrides ``load`` and calls ``super().load(directory)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from baton.core.backend import PendingSave
from baton.core.checkpoint_record import CheckpointFacts


@runtime_checkable
class CheckpointIO(Protocol):
    """One backend's checkpoints: its native files and the facts core records.

    ``save(directory, asynchronous=)`` writes the state under ``directory`` (the
    checkpoint's ``backend/``), returning a ``PendingSave`` when it goes on in the
    background; ``load(directory)`` restores it. ``facts()``, ``layout_refusal(saved)``
    and ``legacy_facts(directory)`` answer ``RecordsCheckpoint``
    (``baton.core.checkpoint_record``) for the backend.
    """

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None: ...

    def load(self, directory: Path) -> None: ...

    def facts(self) -> CheckpointFacts: ...

    def layout_refusal(self, saved: Mapping[str, Any]) -> str | None: ...

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None: ...


class UsesCheckpointIO[IO: CheckpointIO]:
    """A backend whose checkpoint I/O is ``self.checkpoints`` (of type ``IO``): its
    ``save``, ``load``, ``checkpoint_facts``, ``layout_refusal`` and ``legacy_facts``
    hand over to it."""

    #: this backend's checkpoint I/O, built in the backend's ``__init__``
    checkpoints: IO

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        """Write the native checkpoint under ``directory``; a handle when asynchronous."""
        return self.checkpoints.save(Path(directory), asynchronous=asynchronous)

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote (weights, optimizer, data position, RNG)."""
        self.checkpoints.load(Path(directory))

    def checkpoint_facts(self) -> CheckpointFacts:
        return self.checkpoints.facts()

    def layout_refusal(self, saved: Mapping[str, Any]) -> str | None:
        return self.checkpoints.layout_refusal(saved)

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        return self.checkpoints.legacy_facts(directory)
