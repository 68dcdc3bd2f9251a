"""The backend protocol: one optimizer step at a time, native objects inside.

A backend wraps a training system (Lightning Fabric, TorchTitan, Megatron-Core,
MaxText) and exposes just what the loop needs. It calls the system's real step
function (TorchTitan's ``Trainer.train_step``, Megatron-Core's forward-backward function
and optimizer, MaxText's jitted ``train_step``), never a copy of it. One backend is the
exception, by necessity: ``lightning.pytorch.Trainer.fit`` owns its whole loop and has no
one-step entry point, so the ``lightning`` backend re-implements what ``fit`` does
around a ``LightningModule``'s hooks (their order per batch, accumulation windows,
scheduler stepping, the sanity check, validation), with Fabric doing what Lightning
itself does underneath (devices, precision, strategies, ``backward``); its parity tests
compare it with ``Trainer.fit`` bit for bit.

``Backend`` lists everything the driver and the standard callbacks call. Abilities a
backend may lack are small protocols of their own, found in one place
(``abilities``): they live in ``baton.core.abilities`` (``Evaluates``, ``SkipsData``,
``SavesAsync``, ``ShowsGradients``, ``ChecksumsWeights``, ``ReplaysSteps``, ``DryRuns``,
``abilities``, ``check_abilities``, ...) and are re-exported here. A callback that needs
one says so in ``Callback.requires``; the driver checks after ``backend.setup`` and
before the first step, and names the callback and the missing ability.

``BackendBase`` supplies single-process defaults; a backend overrides what differs.
A minimal backend (``tests/support/scalar_backend.py`` type-checks against ``Backend``)::

    class ScalarBackend(BackendBase):
        name = "scalar"

        def setup(self) -> None: ...
        def train_step(self, step: int) -> StepOutput: ...
        def save(self, directory: Path, *, asynchronous: bool = False) -> None: ...
        def load(self, directory: Path) -> None: ...
        def evaluate(self) -> dict[str, float]: ...      # optional: the evaluate ability

A resume may change training settings the restored state depends on (an optimizer's
learning rate, a schedule built for ``max_steps``). A backend that can re-apply them
names them in ``changeable_settings`` and re-applies them after ``load`` in
``apply_changed_settings(changes) -> applied names`` (``changes``: name -> (checkpoint's
value, new value)): the ``ChangesSettings`` protocol. The driver refuses a change that
nobody applies::

        changeable_settings = frozenset({"lr"})

        def apply_changed_settings(self, changes): ...   # returns {"lr"} once applied

A backend that fetches its own batches reports how long each step waited for them in
``StepOutput.data_wait_s`` (seconds, a host float: one ``time.perf_counter()`` pair
around the fetch, nothing synchronised with the device); the ``Goodput`` callback counts
it as ``data_waiting`` instead of productive time. It is optional: ``0.0`` (the default)
means the backend does not time its fetch, and the wait stays part of the step::

        def train_step(self, step: int) -> StepOutput:
            started = time.perf_counter()
            batch = next(self.batches)
            waited = time.perf_counter() - started
            ...
            return StepOutput(loss=loss, tokens=n, data_wait_s=waited)

A backend that tells its user where the run writes (``self.trainer.log_dir`` of a
LightningModule) learns the run directory before ``setup`` through
``use_run_dir(run_dir)`` (the ``UsesRunDir`` protocol).

A backend whose framework states the run's length to user code (a LightningModule
reads ``self.trainer.estimated_stepping_batches`` to size its schedule) learns the
driver's limits before ``setup`` through ``use_run_limits(RunLimits(...))`` (the
``UsesRunLimits`` protocol), so nobody gives ``max_steps`` twice.

A backend records the facts its checkpoints depend on (the parallel layout, the data
position in global samples, the data's fingerprint) and says whether a saved layout
loads on its own through ``RecordsCheckpoint`` (``baton.core.checkpoint_record``): core
writes them into ``baton.json`` and alone compares them on resume. A backend keeps all
of its checkpoint I/O in one object, a ``CheckpointIO`` (``baton.core.checkpoint_io``:
``save``, ``load``, ``facts``, ``layout_refusal``, ``legacy_facts``) held as
``self.checkpoints``; inheriting ``UsesCheckpointIO`` gives it ``save``, ``load`` and the
``RecordsCheckpoint`` methods, each handing over to that object::

    class MyBackend(UsesCheckpointIO[MyCheckpointIO], BackendBase):
        def __init__(self) -> None:
            self.checkpoints = MyCheckpointIO(self)   # reads the engine's state when called
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from baton.core.abilities import (
    ABILITY_HINTS,
    Ability,
    ChecksumsWeights,
    DryRuns,
    Evaluates,
    MissingAbilityError,
    RefusesAbilities,
    ReplaysSteps,
    SavesAsync,
    ShowsGradients,
    SkipsData,
    abilities,
    check_abilities,
    refused_abilities,
)
from baton.core.metrics import StepOutput, to_float


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` if absent), read once per
    process: every checkpoint records versions, and reading package metadata takes
    milliseconds the training loop would wait for.

    >>> installed_version("baton-core") is not None
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


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
    """Everything the driver and the standard callbacks call on a backend."""

    #: the registry name (``fabric``, ``torchtitan``, ...); patches select on it
    name: str
    #: the native config, editable by callbacks in ``on_configure``
    config: Any

    @property
    def multi_rank(self) -> bool:
        """Whether ``barrier`` and ``all_reduce_flags`` really span every rank (the
        ``multi_rank`` ability: a run on several ranks needs it)."""
        ...

    @property
    def training_settings(self) -> frozenset[str]:
        """More setting names whose change on resume alters training (refused unless
        allowed), beside ``resume_settings.TRAINING_SETTINGS``."""
        ...

    @property
    def version(self) -> str:
        """The installed version of the training system (patches' version ranges)."""
        ...

    @property
    def names_evaluation_metrics(self) -> bool:
        """Whether ``evaluate`` returns names its user chose (``NamedMetrics``: a
        LightningModule's ``val_loss``) rather than the backend's own keys, which callbacks
        see as ``eval/<key>``."""
        ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device_type(self) -> str:
        """``cpu``, ``cuda``, ``tpu``, ... (what the device-peak FLOPs table is keyed on)."""
        ...

    @property
    def flops_per_token(self) -> float | None:
        """Model FLOPs per token of one training step (for MFU), or ``None``."""
        ...

    def setup(self) -> None:
        """Build model, optimizer, data and step function (after ``on_configure``)."""
        ...

    def train_step(self, step: int) -> StepOutput:
        """Run optimizer step ``step`` through the system's real step function."""
        ...

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Bring lazy values (device arrays) to the host, in one transfer."""
        ...

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        """OR of each flag over every rank."""
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        """Write the native checkpoint under ``directory``; a handle when asynchronous."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what ``save`` wrote (weights, optimizer, data position, RNG)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts recorded in each checkpoint so a mismatched resume fails clearly."""
        ...

    def teardown(self) -> None:
        """Release what ``setup`` built."""
        ...


@runtime_checkable
class ChangesSettings(Protocol):
    """Re-applies settings a resume changed that its restored state depends on.

    ``changeable_settings`` names them; after ``load`` the driver calls
    ``apply_changed_settings({"lr": (0.002, 0.001)})`` and gets back the names applied.
    """

    @property
    def changeable_settings(self) -> frozenset[str]: ...

    def apply_changed_settings(self, changes: Mapping[str, tuple[Any, Any]]) -> set[str]: ...


@runtime_checkable
class UsesRunDir(Protocol):
    """A backend that shows its user the run directory (a LightningModule reads
    ``self.trainer.log_dir``): the driver calls ``use_run_dir(run_dir)`` after
    ``on_configure`` and before ``setup``; the log directory is ``run_dir / "logs"``
    (``Driver.log_dir``), the checkpoints are under ``run_dir / "checkpoints"``."""

    def use_run_dir(self, run_dir: Path) -> None: ...


@dataclass(frozen=True)
class RunLimits:
    """The driver's stop conditions (``None``: not set), as a backend learns them."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_time_s: float | None = None


@runtime_checkable
class UsesRunLimits(Protocol):
    """A backend whose framework states the run's length to user code (a LightningModule
    reads ``self.trainer.estimated_stepping_batches``): the driver calls
    ``use_run_limits(RunLimits(max_steps=1000))`` after ``on_configure`` and before
    ``setup``, with the limits of this run (a resume's changed ``max_steps`` included)."""

    def use_run_limits(self, limits: RunLimits) -> None: ...


class BackendBase:
    """Defaults for a single-process backend. Subclasses set ``name`` and the rest.

    Optional abilities are not defaulted here: a subclass that defines ``evaluate``,
    ``skip_data``, ``supports_async_save`` (whether saves overlap), or
    ``changeable_settings`` with ``apply_changed_settings`` has them.
    """

    name: str = "base"
    #: distribution whose installed version is this backend's ``version``
    distribution: str | None = None
    #: one process: ``barrier`` and ``all_reduce_flags`` span nothing
    multi_rank: bool = False
    #: no setting names of its own beside ``resume_settings.TRAINING_SETTINGS``
    training_settings: frozenset[str] = frozenset()
    #: ``evaluate`` returns the backend's own keys (``eval/<key>`` for callbacks), not
    #: names its user chose (``NamedMetrics``, see ``baton.core.metrics``)
    names_evaluation_metrics: bool = False
    config: Any = None

    @property
    def version(self) -> str:
        if self.distribution is None:
            return "0"
        return installed_version(self.distribution) or "0"

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

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Bring lazy values to the host; subclasses batch this into one transfer."""
        return {k: to_float(v) for k, v in values.items()}

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return list(flags)

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        raise NotImplementedError

    def load(self, directory: Path) -> None:
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait for every rank (no-op with one process)."""

    def teardown(self) -> None:
        """Release what ``setup`` built."""

    def describe(self) -> dict[str, Any]:
        """Facts recorded in each checkpoint so a mismatched resume fails clearly."""
        return {}

    @property
    def refused_abilities(self) -> Mapping[str, str]:
        """Abilities this backend's methods offer but its built run cannot, with why
        (``refused_abilities(backend)``); none by default."""
        return {}


__all__ = [
    "ABILITY_HINTS",
    "Ability",
    "Backend",
    "BackendBase",
    "ChangesSettings",
    "ChecksumsWeights",
    "DataExhausted",
    "DryRuns",
    "Evaluates",
    "MissingAbilityError",
    "PendingSave",
    "RefusesAbilities",
    "ReplaysSteps",
    "RunLimits",
    "SavesAsync",
    "ShowsGradients",
    "SkipsData",
    "UsesRunDir",
    "UsesRunLimits",
    "abilities",
    "check_abilities",
    "installed_version",
    "refused_abilities",
]
