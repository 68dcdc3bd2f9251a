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
(``abilities``): ``evaluate`` (``Evaluates``), ``skip_data`` (``SkipsData``),
``async_save`` (``SavesAsync`` with ``supports_async_save`` true), ``multi_rank``
(``multi_rank`` true: flags and barriers that really span ranks), ``gradients``
(``ShowsGradients``: the gradients before each optimizer step), ``weight_checksums``
(``ChecksumsWeights``), ``step_replay`` (``ReplaysSteps``), ``model_state``
(``HasModelState``: parameters, gradients, optimizer groups and freezing by name,
``baton.core.model_state``) and ``dry_run`` (``DryRuns``: the parallel plan, checked
before ``setup``; ``baton run RECIPE --dry-run``). A callback that needs one says so in
``Callback.requires``; the driver checks after ``backend.setup`` and before the first
step, and names the callback and the missing ability.

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
writes them into ``baton.json`` and alone compares them on resume.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from baton.core.metrics import StepOutput, to_float
from baton.core.model_state import HasModelState

#: what a backend may or may not be able to do; see ``abilities``
Ability = Literal[
    "evaluate",
    "skip_data",
    "async_save",
    "multi_rank",
    "gradients",
    "weight_checksums",
    "step_replay",
    "model_state",
    "dry_run",
]

ABILITY_HINTS: dict[str, str] = {
    "evaluate": "an evaluate() method returning host or lazy metrics",
    "skip_data": "a skip_data(steps) method that advances the training data",
    "async_save": "supports_async_save = True and save(asynchronous=True) returning a handle",
    "multi_rank": "multi_rank = True: barrier() and all_reduce_flags() that span every rank",
    "gradients": "watch_gradients(watcher): the gradients shown before each optimizer step",
    "weight_checksums": "gather_weight_checksums() returning each rank's parameter checksums",
    "step_replay": "replay_next_step() and gather_replay_mismatches(): a step run twice, compared",
    "model_state": "model_state() returning a baton.core.model_state.ModelState: parameters, "
    "gradients, optimizer groups and freezing by name",
    "dry_run": "dry_run(world_size) returning the parallel plan, checked, before setup and "
    "without allocating the model",
}


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
class Evaluates(Protocol):
    """Ability ``evaluate``: metrics of a held-out set (lazy values are fine)."""

    def evaluate(self) -> Mapping[str, Any]: ...


@runtime_checkable
class SkipsData(Protocol):
    """Ability ``skip_data``: advance the training data by ``steps`` optimizer steps'
    worth of batches without training on them (a guard skipping a bad window)."""

    def skip_data(self, steps: int) -> None: ...


@runtime_checkable
class SavesAsync(Protocol):
    """Ability ``async_save``: ``save(asynchronous=True)`` overlaps with training."""

    @property
    def supports_async_save(self) -> bool: ...


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


@runtime_checkable
class ChecksumsWeights(Protocol):
    """Ability ``weight_checksums``: a bitwise checksum of each parameter this rank holds
    as a data-parallel replica, and of the optimizer state of those parameters where it
    is replicated too, gathered from every rank (a collective: every rank calls it at
    the same step). Entry ``r`` is rank ``r``'s ``{name: checksum}``; a parameter is
    keyed by its name, its optimizer state ``"<parameter>:<state>"``
    (``"layer.weight:exp_avg"``). Ranks are compared on the names they hold: a backend
    whose ranks hold different shards under one name keys them apart
    (``"layer.weight@tp1"``). A backend that cannot (every parameter sharded, no
    replica) raises a clear error when called and says so in its docs."""

    def gather_weight_checksums(self) -> list[dict[str, str]]: ...


@runtime_checkable
class DryRuns(Protocol):
    """Ability ``dry_run``: the plan of the configured run for ``world_size`` ranks
    (devices), checked by the framework's own validation, as readable text; called
    instead of ``setup`` (``baton run RECIPE --dry-run``), it allocates no model and
    needs no accelerator. A layout that does not fit raises ``ValueError`` naming the
    setting."""

    def dry_run(self, world_size: int) -> str: ...


@runtime_checkable
class ReplaysSteps(Protocol):
    """Ability ``step_replay``: a step run twice from the same state, compared bitwise.

    ``replay_next_step()`` (called before a step, on every rank alike) asks that the next
    ``train_step`` snapshot the state (weights, optimizer, schedule, random state), run
    the step, take the checksums of weights and optimizer state, restore the snapshot,
    run the step again on the same batches without drawing new ones, and take the
    checksums again; the second run's result stands, so a healthy replay leaves training
    exactly as it would have been. It returns ``False`` when the next step cannot be
    replayed (a caller asks again before a later step). After that step,
    ``gather_replay_mismatches()`` (a collective) returns per rank the names (as in
    ``ChecksumsWeights``) whose checksums differed between the two runs: a fault of
    that rank's hardware, since a healthy step is deterministic. Gradient watchers
    (``ShowsGradients``) see both runs of a replayed step."""

    def replay_next_step(self) -> bool: ...

    def gather_replay_mismatches(self) -> list[list[str]]: ...


@runtime_checkable
class ShowsGradients(Protocol):
    """Ability ``gradients``: before each optimizer step (after backward, before
    clipping) the backend calls every watcher with ``{parameter name: gradient}``
    (device arrays, for lazy arithmetic; parameters without a gradient are left out)."""

    def watch_gradients(self, watcher: Callable[[Mapping[str, Any]], None]) -> None: ...


def abilities(backend: Backend) -> frozenset[Ability]:
    """The optional abilities of ``backend`` (the one place they are decided).

    Read after ``backend.setup``: some depend on the built run (a Fabric strategy that
    cannot save asynchronously, the number of ranks).
    """
    found: set[Ability] = set()
    if isinstance(backend, Evaluates):
        found.add("evaluate")
    if isinstance(backend, SkipsData):
        found.add("skip_data")
    if isinstance(backend, SavesAsync) and backend.supports_async_save:
        found.add("async_save")
    if isinstance(backend, ShowsGradients):
        found.add("gradients")
    if isinstance(backend, ChecksumsWeights):
        found.add("weight_checksums")
    if isinstance(backend, ReplaysSteps):
        found.add("step_replay")
    if isinstance(backend, HasModelState):
        found.add("model_state")
    if isinstance(backend, DryRuns):
        found.add("dry_run")
    if backend.multi_rank:
        found.add("multi_rank")
    return frozenset(found - refused_abilities(backend).keys())


@runtime_checkable
class RefusesAbilities(Protocol):
    """A backend that has an ability's methods but cannot offer it in the run it built
    says so, with the reason and the fix, in ``refused_abilities`` (read after ``setup``;
    ``BackendBase``: none). Example: a Fabric run sharded by FSDP gives
    ``{"weight_checksums": "this strategy shards every parameter: ...; use strategy='ddp'"}``."""

    @property
    def refused_abilities(self) -> Mapping[str, str]: ...


def refused_abilities(backend: Backend) -> Mapping[str, str]:
    """``backend.refused_abilities`` (``{ability: why}``), or none."""
    return backend.refused_abilities if isinstance(backend, RefusesAbilities) else {}


class MissingAbilityError(ValueError):
    """A callback (or a driver setting) needs an ability the backend does not have."""


def check_abilities(
    backend: Backend, needs: Mapping[str, frozenset[Ability] | set[Ability]]
) -> frozenset[Ability]:
    """Raise ``MissingAbilityError`` naming each requester and what it lacks.

    ``needs`` maps who asks (``"LossGuard(action='rollback')"``, ``"eval_every=100"``)
    to the abilities it needs. Returns the backend's abilities.
    """
    have = abilities(backend)
    refused = refused_abilities(backend)
    problems = [
        f"{who} needs {ability!r} ("
        + (f"refused: {refused[ability]}" if ability in refused else ABILITY_HINTS[ability])
        + ")"
        for who, wanted in needs.items()
        for ability in sorted(wanted)
        if ability not in have
    ]
    if problems:
        raise MissingAbilityError(
            f"backend {backend.name!r} lacks what this run needs:\n  "
            + "\n  ".join(problems)
            + f"\nit has: {', '.join(sorted(have)) or 'none of the optional abilities'}; "
            "remove or reconfigure those callbacks or settings, or use a backend that can"
        )
    return have


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
