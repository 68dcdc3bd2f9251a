"""The driver's rollout collaborator: what the loop calls on a run that trains on
rollouts (online RL), and the records callbacks receive.

The loop calls ``before_step(step)`` between ``on_step_start`` and the backend's
``train_step``. The collaborator makes the step's rollouts ready for the backend's data
stream (sampling new ones, or reusing the last batch for another optimization step) and
answers with their records when they are new (``None`` on a reused batch) and the
metrics the step logs. Its state (the prompt order's position, the sampler's random
state, a batch not yet used up) is saved in every checkpoint: ``save`` writes its arrays
into the checkpoint's ``rollouts/`` folder (on the rank that writes the checkpoint) and
returns the rest as JSON data for ``baton.json``; ``load`` takes both back on resume,
load and rollback.

Example (what ``Driver`` does with ``Driver(backend, callbacks, rollouts=phase)``)::

    outcome = rollouts.before_step(driver.step + 1)
    for name, value in outcome.metrics.items():
        driver.record(name, value)                    # reward, timing/generation_s, ...
    if outcome.records is not None:
        driver.dispatch("on_rollout_end", outcome.records)

    state = rollouts.save(checkpoint / "rollouts", write=rank == 0)   # -> baton.json
    rollouts.load(checkpoint / "rollouts", state)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class RolloutRecord(Protocol):
    """One rollout (a prompt and one completion) as callbacks see it."""

    @property
    def step(self) -> int:
        """The step whose rollouts it belongs to (the first that trains on them)."""
        ...

    @property
    def index(self) -> int:
        """Its place among the step's rollouts (its row)."""
        ...

    @property
    def prompt_index(self) -> int:
        """The prompt's index in the prompts data."""
        ...

    @property
    def completion(self) -> str:
        """The completion's text."""
        ...

    @property
    def rewards(self) -> Mapping[str, float | None]:
        """Each reward function's value (``None``: it could not score the completion)."""
        ...

    @property
    def reward(self) -> float:
        """The weighted sum of the rewards (NaN when none could score it)."""
        ...

    @property
    def advantage(self) -> float:
        """The advantage the loss weighs the completion with."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The whole record as JSON data: prompt and completion ids, the text, each
        reward, the advantage, the sampling log-probability sum, truncation."""
        ...


class RolloutOutcome(Protocol):
    """What ``before_step`` answers."""

    @property
    def records(self) -> Sequence[RolloutRecord] | None:
        """The new rollouts' records; ``None`` when the step reuses the last batch."""
        ...

    @property
    def metrics(self) -> Mapping[str, Any]:
        """Values the step logs (host floats or lazy backend values)."""
        ...


class Rollouts(Protocol):
    """The rollout phase the loop calls before each training step."""

    def before_step(self, step: int) -> RolloutOutcome:
        """Make step ``step``'s rollouts ready for the backend (every rank calls it)."""
        ...

    def save(self, directory: Path, *, write: bool) -> dict[str, Any]:
        """The state to resume from: arrays written into ``directory`` when ``write``
        (the rank that writes the checkpoint), the rest returned as JSON data."""
        ...

    def load(self, directory: Path, state: Mapping[str, Any]) -> None:
        """Restore what ``save`` wrote into ``directory`` and returned as ``state``."""
        ...
