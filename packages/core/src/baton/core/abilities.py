"""What a backend can do beyond training, declared once: ``Backend.abilities()``.

Every backend trains, saves and loads. The rest is optional, and a backend says which
of it it offers in one typed declaration, an ``Abilities``, returned by its
``abilities()`` method (asked after ``setup``, where the answer depends on the built run;
``dry_run`` is asked before). For what it cannot offer in the run it built it says why
and what to do, and core derives every check and every error message from that one
declaration::

    def abilities(self) -> Abilities:
        return Abilities(evaluate=True, skip_data=True, model_state=True,
                         weight_checksums=True).refusing(
            weight_checksums=(
                "this strategy shards every parameter: no replica to compare; "
                "use strategy='ddp'" if self.fully_sharded else None
            ),
        )

The abilities and the ``Backend`` methods each one promises:

- ``evaluate``: ``evaluate()`` returns metrics of a held-out set (lazy values are fine);
- ``skip_data``: ``skip_data(steps)`` advances the training data by ``steps`` optimizer
  steps' worth of batches without training on them (a guard skipping a bad window);
- ``async_save``: ``save(directory, asynchronous=True)`` returns a ``PendingSave``
  and the write overlaps with training;
- ``multi_rank``: ``barrier()`` and ``all_reduce_flags()`` span every rank (a run on
  several ranks needs it);
- ``weight_checksums``: ``gather_weight_checksums()``, each rank's bitwise checksums of
  the parameters (and their optimizer state) it holds as a replica;
- ``step_replay``: ``replay_next_step()`` and ``gather_replay_mismatches()``, a step
  run twice from one state and compared;
- ``model_state``: ``model_state()`` returns a ``baton.core.model_state.ModelState``:
  parameters, gradients (``watch_gradients``), optimizer groups and freezing by name;
- ``dry_run``: ``dry_run(world_size)`` returns the parallel plan, checked, without
  allocating the model (``baton run RECIPE --dry-run``).

A callback that needs one says so in ``Callback.requires``; the driver checks after
``backend.setup`` and before the first step (``check_abilities``) and names the
callback and what is missing::

    check_abilities("fabric", backend.abilities(), {"LossGuard(action='rollback')": {"skip_data"}})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal, cast, get_args

from baton.core.errors import UsageError

#: what a backend may or may not be able to do; see ``Abilities``
Ability = Literal[
    "evaluate",
    "skip_data",
    "async_save",
    "multi_rank",
    "weight_checksums",
    "step_replay",
    "model_state",
    "dry_run",
]

#: what each ability asks of a backend, shown when a run needs one its backend lacks
ABILITY_HINTS: dict[Ability, str] = {
    "evaluate": "evaluate() returning host or lazy metrics",
    "skip_data": "skip_data(steps) advancing the training data",
    "async_save": "save(asynchronous=True) returning a PendingSave while training goes on",
    "multi_rank": "barrier() and all_reduce_flags() that span every rank",
    "weight_checksums": "gather_weight_checksums() returning each rank's parameter checksums",
    "step_replay": "replay_next_step() and gather_replay_mismatches(): a step run twice, compared",
    "model_state": "model_state() returning a baton.core.model_state.ModelState: parameters, "
    "gradients, optimizer groups and freezing by name",
    "dry_run": "dry_run(world_size) returning the parallel plan, checked, before setup and "
    "without allocating the model",
}


@dataclass(frozen=True)
class Abilities:
    """A backend's declaration of its optional abilities (``Backend.abilities()``).

    Each field says whether the backend offers that ability in the run it built;
    ``refused`` names those it cannot offer there, with why and the fix (build it with
    ``refusing``). Nothing else decides an ability: no method probing, no flags.

    >>> declared = Abilities(evaluate=True, weight_checksums=True).refusing(
    ...     weight_checksums="every parameter is sharded; use strategy='ddp'")
    >>> sorted(declared.names)
    ['evaluate']
    >>> declared.why_not("weight_checksums")
    "refused: every parameter is sharded; use strategy='ddp'"
    """

    evaluate: bool = False
    skip_data: bool = False
    async_save: bool = False
    multi_rank: bool = False
    weight_checksums: bool = False
    step_replay: bool = False
    model_state: bool = False
    dry_run: bool = False
    #: abilities this run cannot offer, each with why and what to do instead
    refused: Mapping[Ability, str] = field(default_factory=dict[Ability, str])

    def __post_init__(self) -> None:
        unknown = set(self.refused) - set(ABILITY_HINTS)
        if unknown:
            raise ValueError(f"refused names no ability: {sorted(unknown)}")
        both = [name for name in self.refused if getattr(self, name)]
        if both:
            raise ValueError(f"declared both offered and refused: {sorted(both)}")

    @property
    def names(self) -> frozenset[Ability]:
        """The abilities offered."""
        return frozenset(
            cast(Ability, f.name)
            for f in fields(self)
            if f.name != "refused" and getattr(self, f.name)
        )

    def refusing(self, **why: str | None) -> Abilities:
        """This declaration with each ability given a reason (``None``: kept as is)
        turned off and refused for that reason."""
        reasons = {cast(Ability, name): reason for name, reason in why.items() if reason}
        unknown = set(reasons) - set(get_args(Ability))
        if unknown:
            raise ValueError(f"refusing names no ability: {sorted(unknown)}")
        offered = {name: False for name in reasons}
        return replace(self, **offered, refused={**self.refused, **reasons})

    def why_not(self, ability: Ability) -> str:
        """What a run that needs ``ability`` is told when this backend lacks it."""
        if ability in self.refused:
            return f"refused: {self.refused[ability]}"
        return ABILITY_HINTS[ability]


class MissingAbilityError(UsageError):
    """A callback (or a driver setting) needs an ability the backend does not have: a
    usage error (exit status 2), named with who needs it and why the backend lacks it."""


def check_abilities(
    backend: str, declared: Abilities, needs: Mapping[str, frozenset[Ability] | set[Ability]]
) -> frozenset[Ability]:
    """Raise ``MissingAbilityError`` naming each requester and what it lacks of what the
    backend named ``backend`` ``declared``.

    ``needs`` maps who asks (``"LossGuard(action='rollback')"``, ``"eval_every=100"``)
    to the abilities it needs. Returns the abilities offered.
    """
    have = declared.names
    problems = [
        f"{who} needs {ability!r} ({declared.why_not(ability)})"
        for who, wanted in needs.items()
        for ability in sorted(wanted)
        if ability not in have
    ]
    if problems:
        raise MissingAbilityError(
            f"backend {backend!r} lacks what this run needs:\n  "
            + "\n  ".join(problems)
            + f"\nit has: {', '.join(sorted(have)) or 'none of the optional abilities'}; "
            "remove or reconfigure those callbacks or settings, or use a backend that can"
        )
    return have


def lacking(backend: str, declared: Abilities, ability: Ability) -> MissingAbilityError:
    """The error a ``BackendBase`` method raises when called on the backend named
    ``backend`` whose declaration does not offer its ability."""
    return MissingAbilityError(
        f"backend {backend!r} does not offer {ability!r} ({declared.why_not(ability)})"
    )
