"""What a backend may lack: each optional ability is a small protocol, decided in one place.

``abilities(backend)`` names what a built backend can do: ``evaluate`` (``Evaluates``),
``skip_data`` (``SkipsData``), ``async_save`` (``SavesAsync`` with
``supports_async_save`` true), ``multi_rank`` (``multi_rank`` true: flags and barriers
that really span ranks), ``gradients`` (``ShowsGradients``: the gradients before each
optimizer step), ``weight_checksums`` (``ChecksumsWeights``), ``step_replay``
(``ReplaysSteps``), ``model_state`` (``HasModelState``: parameters, gradients, optimizer
groups and freezing by name, ``baton.core.model_state``) and ``dry_run`` (``DryRuns``:
the parallel plan, checked before ``setup``; ``baton run RECIPE --dry-run``), less what
the backend refuses in the run it built (``RefusesAbilities``). A callback that needs one
says so in ``Callback.requires``; the driver checks after ``backend.setup`` and before the
first step (``check_abilities``), and names the callback and the missing ability::

    check_abilities(backend, {"LossGuard(action='rollback')": {"skip_data"}})

The backend contract itself (``Backend``, ``BackendBase``) is ``baton.core.backend``,
which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from baton.core.model_state import HasModelState

if TYPE_CHECKING:
    from baton.core.backend import Backend

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
