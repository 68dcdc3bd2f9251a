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

``Backend`` is the whole contract: what the driver and the standard callbacks call.
Besides training, saving and loading, a backend may offer optional abilities
(evaluation, skipping data, asynchronous saves, several ranks, weight checksums, step
replay, the model-state view, a dry run); it declares which in one typed place, its
``abilities()`` (``baton.core.abilities.Abilities``), with a reason for each it refuses,
and core derives every check and error message from that declaration. A callback that
needs one says so in ``Callback.requires``; the driver checks after ``backend.setup``
and before the first step, and names the callback and the missing ability.

``BackendBase`` supplies single-process defaults for everything but the four methods a
backend must write, and refuses each optional ability's methods until the backend
offers it. A minimal backend (``examples/minimal_backend.py`` is a whole one)::

    class ScalarBackend(BackendBase):
        name = "scalar"

        def abilities(self) -> Abilities:
            return Abilities(evaluate=True)

        def setup(self) -> None: ...
        def train_step(self, step: int) -> StepOutput: ...
        def save(self, directory: Path, *, asynchronous: bool = False) -> None: ...
        def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None: ...
        def evaluate(self) -> dict[str, float]: ...      # the evaluate ability

The contract's groups, each with ``BackendBase`` defaults where one makes sense:

- **identity**: ``name``, ``version``, ``config`` (the native config, editable in
  ``on_configure``), ``describe()`` (facts a mismatched resume is refused on),
  ``training_settings``, ``names_evaluation_metrics``;
- **the run**: ``setup()``, ``train_step(step) -> StepOutput``, ``fetch(values)`` (lazy
  values to the host in one transfer), ``teardown()``; before ``setup`` the driver
  hands over the run directory (``use_run_dir``) and its limits (``use_run_limits``,
  for a framework that states the run's length to user code);
- **ranks**: ``rank``, ``world_size``, ``barrier()``, ``all_reduce_flags(flags)``,
  ``device_type``, ``flops_per_token``;
- **checkpoints**: ``save(directory, asynchronous=)`` and ``load(directory, plan)``;
  ``checkpoint_facts()`` (layout, data position in samples, data fingerprint: recorded
  in ``baton.json`` and compared by core on resume), ``plan_load(saved_layout)`` (how a
  checkpoint written on another layout loads here, or why it cannot: a ``LoadPlan``),
  ``legacy_facts(directory)``, ``claims_checkpoint(saved_name, directory)``;
- **a resume's changes**: ``changeable_settings`` and
  ``apply_changed_settings({"lr": (0.002, 0.001)}) -> applied names``;
- **abilities**: ``abilities()`` and the methods of those it offers.

A backend that fetches its own batches reports how long each step waited for them in
``StepOutput.data_wait_s`` (seconds, a host float: one ``time.perf_counter()`` pair
around the fetch); the ``Goodput`` callback counts it as ``data_waiting``.

A backend keeps its checkpoint I/O in one part, a ``CheckpointIO``
(``baton.core.checkpoints.io``), built in ``setup`` from the state it needs (never from
the backend itself), and hands ``save``, ``load``, ``checkpoint_facts``, ``plan_load``
and ``legacy_facts`` over to it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from baton.core.abilities import Abilities, Ability, lacking
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan
from baton.core.metrics import StepOutput, to_float
from baton.core.model_state import ModelState


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


@dataclass(frozen=True)
class RunLimits:
    """The driver's stop conditions (``None``: not set), as a backend learns them."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_time_s: float | None = None


@runtime_checkable
class Backend(Protocol):
    """Everything the driver and the standard callbacks call on a backend (see the
    module's text for the groups; ``BackendBase`` defaults all but four)."""

    # -- identity -----------------------------------------------------------------------
    #: the registry name (``fabric``, ``torchtitan``, ...); patches select on it
    name: str
    #: the native config, editable by callbacks in ``on_configure``
    config: Any

    @property
    def version(self) -> str:
        """The installed version of the training system (patches' version ranges)."""
        ...

    @property
    def training_settings(self) -> frozenset[str]:
        """More setting names whose change on resume alters training (refused unless
        allowed), beside ``options.TRAINING_SETTINGS``."""
        ...

    @property
    def names_evaluation_metrics(self) -> bool:
        """Whether ``evaluate`` returns names its user chose (``NamedMetrics``: a
        LightningModule's ``val_loss``) rather than the backend's own keys, which callbacks
        see as ``eval/<key>``."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts recorded in each checkpoint so a mismatched resume fails clearly."""
        ...

    def abilities(self) -> Abilities:
        """The optional abilities this backend offers, and why it refuses the others
        (asked after ``setup``; ``dry_run`` before it)."""
        ...

    # -- the run ------------------------------------------------------------------------
    def use_run_dir(self, run_dir: Path) -> None:
        """Called before ``setup`` with the run directory, for a backend that shows it to
        its user (a LightningModule's ``self.trainer.log_dir``: ``run_dir / "logs"``)."""
        ...

    def use_run_limits(self, limits: RunLimits) -> None:
        """Called before ``setup`` with the driver's limits, for a framework that states
        the run's length to user code (``self.trainer.estimated_stepping_batches``)."""
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

    def teardown(self) -> None:
        """Release what ``setup`` built."""
        ...

    # -- ranks --------------------------------------------------------------------------
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

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        """OR of each flag over every rank (the ``multi_rank`` ability)."""
        ...

    def barrier(self) -> None:
        """Wait for every rank (the ``multi_rank`` ability)."""
        ...

    # -- checkpoints --------------------------------------------------------------------
    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        """Write the native checkpoint under ``directory``; a handle when asynchronous
        (the ``async_save`` ability)."""
        ...

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        """Restore what ``save`` wrote (weights, optimizer, data position, RNG), as
        ``plan`` says (``plan_load``: a checkpoint written on another layout)."""
        ...

    def checkpoint_facts(self) -> CheckpointFacts:
        """The layout, the data position (samples) and the data's fingerprint this run's
        checkpoints depend on (``baton.core.checkpoint_record``)."""
        ...

    def plan_load(self, saved_layout: Mapping[str, Any]) -> LoadPlan:
        """How a checkpoint saved on ``saved_layout`` (which differs from this run's)
        loads here, or ``LoadPlan(refusal=...)``: why it cannot and what to do. No side
        effect: ``load`` is handed the plan."""
        ...

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """The facts an older checkpoint kept in the backend's side file in
        ``directory`` (its ``backend/``), ``None`` when there is none."""
        ...

    def claims_checkpoint(self, saved_name: str, directory: Path) -> bool:
        """Whether a checkpoint recorded as written by backend ``saved_name`` (an older
        name of this one) is this backend's own, told by what its files hold."""
        ...

    # -- a resume's changes -------------------------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """Settings a resume may change that the restored state depends on (``lr``)."""
        ...

    def apply_changed_settings(self, changes: Mapping[str, tuple[Any, Any]]) -> set[str]:
        """Re-apply ``{name: (checkpoint's value, new value)}`` after ``load``; returns
        the names applied."""
        ...

    # -- the optional abilities' methods -------------------------------------------------
    def evaluate(self) -> Mapping[str, Any]:
        """``evaluate``: metrics of a held-out set (lazy values are fine)."""
        ...

    def skip_data(self, steps: int) -> None:
        """``skip_data``: advance the training data by ``steps`` optimizer steps' worth
        of batches without training on them."""
        ...

    def model_state(self) -> ModelState:
        """``model_state``: the run's parameters, gradients, optimizer groups and
        freezing by name (``baton.core.model_state``), after ``setup``."""
        ...

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        """``weight_checksums``: a collective; entry ``r`` is rank ``r``'s
        ``{name: checksum}`` of each parameter it holds as a data-parallel replica, and of
        its optimizer state where replicated too (``"layer.weight:exp_avg"``). Ranks are
        compared on the names they hold: a backend whose ranks hold different shards
        under one name keys them apart (``"layer.weight@tp1"``)."""
        ...

    def replay_next_step(self) -> bool:
        """``step_replay``: ask that the next ``train_step`` snapshot the state (weights,
        optimizer, schedule, random state), run, checksum, restore, run again on the same
        batches and checksum again; the second run stands. ``False``: the next step
        cannot be replayed (ask again later). Gradient watchers see both runs."""
        ...

    def gather_replay_mismatches(self) -> list[list[str]]:
        """``step_replay``: a collective after the replayed step; per rank the names
        whose checksums differed between the two runs (a fault of that rank)."""
        ...

    def dry_run(self, world_size: int) -> str:
        """``dry_run``: the configured run's plan for ``world_size`` ranks, checked by
        the framework's own validation, without allocating the model (called instead of
        ``setup``). A layout that does not fit raises ``ValueError`` naming the setting."""
        ...


class BackendBase:
    """Defaults for a single-process backend that offers no optional ability: a subclass
    sets ``name``, writes ``setup``, ``train_step``, ``save`` and ``load``, and
    ``abilities()`` with the methods of what it offers. The optional abilities' methods
    here raise ``MissingAbilityError`` naming the ability."""

    name: str = "base"
    #: distribution whose installed version is this backend's ``version``
    distribution: str | None = None
    #: no setting names of its own beside ``options.TRAINING_SETTINGS``
    training_settings: frozenset[str] = frozenset()
    #: ``evaluate`` returns the backend's own keys (``eval/<key>`` for callbacks), not
    #: names its user chose (``NamedMetrics``, see ``baton.core.metrics``)
    names_evaluation_metrics: bool = False
    config: Any = None

    # -- identity -----------------------------------------------------------------------
    @property
    def version(self) -> str:
        if self.distribution is None:
            return "0"
        return installed_version(self.distribution) or "0"

    def describe(self) -> dict[str, Any]:
        """Facts recorded in each checkpoint so a mismatched resume fails clearly."""
        return {}

    def abilities(self) -> Abilities:
        """None of the optional abilities."""
        return Abilities()

    # -- the run ------------------------------------------------------------------------
    def use_run_dir(self, run_dir: Path) -> None:
        """Nothing shows the run directory to user code."""

    def use_run_limits(self, limits: RunLimits) -> None:
        """Nothing states the run's length to user code."""

    def setup(self) -> None:
        raise NotImplementedError

    def train_step(self, step: int) -> StepOutput:
        raise NotImplementedError

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Bring lazy values to the host; subclasses batch this into one transfer."""
        return {k: to_float(v) for k, v in values.items()}

    def teardown(self) -> None:
        """Release what ``setup`` built."""

    # -- ranks --------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def device_type(self) -> str:
        """``cpu``, ``cuda``, ``tpu``, ... (what the device-peak FLOPs table is keyed on)."""
        return "cpu"

    @property
    def flops_per_token(self) -> float | None:
        return None

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return list(flags)

    def barrier(self) -> None:
        """Wait for every rank (no-op with one process)."""

    # -- checkpoints --------------------------------------------------------------------
    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        raise NotImplementedError

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        raise NotImplementedError

    def checkpoint_facts(self) -> CheckpointFacts:
        """No layout, no data position, no fingerprint."""
        return CheckpointFacts()

    def plan_load(self, saved_layout: Mapping[str, Any]) -> LoadPlan:
        """Everything loads."""
        return LOAD_ALL

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """No older side file."""
        return None

    def claims_checkpoint(self, saved_name: str, directory: Path) -> bool:
        """No other name was ever this backend's."""
        return False

    # -- a resume's changes -------------------------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """None beside what the driver applies itself."""
        return frozenset()

    def apply_changed_settings(self, changes: Mapping[str, tuple[Any, Any]]) -> set[str]:
        """Applies none."""
        return set()

    # -- the optional abilities' methods, refused until offered -------------------------
    def evaluate(self) -> Mapping[str, Any]:
        raise lacking(self.name, self.abilities(), "evaluate")

    def skip_data(self, steps: int) -> None:
        raise lacking(self.name, self.abilities(), "skip_data")

    def model_state(self) -> ModelState:
        raise lacking(self.name, self.abilities(), "model_state")

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        raise lacking(self.name, self.abilities(), "weight_checksums")

    def replay_next_step(self) -> bool:
        raise lacking(self.name, self.abilities(), "step_replay")

    def gather_replay_mismatches(self) -> list[list[str]]:
        raise lacking(self.name, self.abilities(), "step_replay")

    def dry_run(self, world_size: int) -> str:
        raise lacking(self.name, self.abilities(), "dry_run")


def offers(backend: Backend, ability: Ability) -> bool:
    """Whether ``backend`` declares ``ability`` (``backend.abilities()``)."""
    return ability in backend.abilities().names


__all__ = [
    "Backend",
    "BackendBase",
    "DataExhausted",
    "PendingSave",
    "RunLimits",
    "installed_version",
    "offers",
]
