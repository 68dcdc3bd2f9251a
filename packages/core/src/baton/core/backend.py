"""The backend protocol: one optimizer step at a time, native objects inside.

A backend wraps a training system (Lightning Fabric, TorchTitan, Megatron-Core,
MaxText) and exposes just what the loop needs. It calls the system's real step
function; baton never re-implements it.

``BackendBase`` supplies single-process defaults; a backend overrides what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from baton.core.metrics import StepOutput, to_float


class DataExhausted(Exception):
    """Raised by ``train_step`` when the training data has ended and the backend is
    configured to stop there: the driver ends the run at the last completed step
    (saving first when a callback asked to save on stop)."""


@runtime_checkable
class PendingSave(Protocol):
    """An asynchronous save in flight: the loop polls ``done`` and finally ``wait``s."""

    def done(self) -> bool: ...

    def wait(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    config: Any

    @property
    def version(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def flops_per_token(self) -> float | None: ...

    def setup(self) -> None: ...

    def train_step(self, step: int) -> StepOutput: ...

    def evaluate(self) -> Mapping[str, Any]: ...

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]: ...

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]: ...

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None: ...

    def load(self, directory: Path) -> None: ...

    def barrier(self) -> None: ...

    def teardown(self) -> None: ...


class BackendBase:
    """Defaults for a single-process backend. Subclasses set ``name`` and the rest."""

    name: str = "base"
    #: distribution whose installed version is this backend's ``version``
    distribution: str | None = None
    #: whether ``save(asynchronous=True)`` really overlaps with training
    supports_async_save: bool = False
    config: Any = None

    @property
    def version(self) -> str:
        if self.distribution is None:
            return "0"
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.distribution)
        except PackageNotFoundError:
            return "0"

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def flops_per_token(self) -> float | None:
        return None

    @property
    def device_type(self) -> str:
        """``cpu``, ``cuda``, ``tpu``, ... (what the device-peak FLOPs table is keyed on)."""
        return "cpu"

    def setup(self) -> None:
        raise NotImplementedError

    def train_step(self, step: int) -> StepOutput:
        raise NotImplementedError

    def evaluate(self) -> Mapping[str, Any]:
        raise NotImplementedError(f"backend {self.name!r} has no evaluation configured")

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Bring lazy values to the host; subclasses batch this into one transfer."""
        return {k: to_float(v) for k, v in values.items()}

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return list(flags)

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        raise NotImplementedError

    def load(self, directory: Path) -> None:
        raise NotImplementedError

    def skip_data(self, steps: int) -> None:
        """Advance the training data by ``steps`` optimizer steps' worth of batches
        without training on them (a guard skipping a bad window after a rollback)."""
        raise NotImplementedError(f"backend {self.name!r} cannot skip training data")

    def barrier(self) -> None:
        """Wait for every rank (no-op with one process)."""

    def teardown(self) -> None:
        """Release what ``setup`` built."""

    def describe(self) -> dict[str, Any]:
        """Facts recorded in each checkpoint so a mismatched resume fails clearly."""
        return {}
