"""Freeze parameters matching name patterns for the first steps of a run.

Example::

    # embeddings and the first two blocks stay as loaded for 100 steps, then train
    Freeze(["model.embed_tokens.*", "model.layers.0.*", "model.layers.1.*"], until_step=100)

    Freeze("*embed*")                      # frozen for the whole run

The way Lightning's ``BackboneFinetuning`` trains a head before the body: steps
``1..until_step`` leave the matching parameters and their optimizer state exactly as they
were (the backend's ``model_state().freeze``: no gradient, no update, no optimizer-state
change), and from step ``until_step + 1`` they train again. Patterns are ``fnmatch``
globs over the ``model_state`` names (Hugging Face names for a model-spec run); a
pattern that matches no parameter on any rank is refused, on every rank alike, with the
names there are (under pipeline parallelism a stage freezes the matching parameters it
holds, and one holding none of them freezes nothing). The decision is
made before each step from the step number, so a resume (or a rollback) inside the
frozen window freezes again and one after it does not; the state records what was
frozen.

Metric keys logged: ``freeze/frozen`` (the number of frozen parameters) on log steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from baton.core.abilities import Ability
from baton.core.callback import Callback
from baton.core.errors import UsageError
from baton.core.model_state import ModelState, matches
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView


@CALLBACKS.register("freeze")
class Freeze(Callback):
    """Freeze the parameters matching ``patterns`` until ``until_step`` (``None``: always).

    Args:
        patterns: glob patterns over the parameter names (``model.layers.0.*``, ``*embed*``).
        until_step: the first step that trains them again (``None``: frozen for the run).
    """

    state_key = "freeze"

    def __init__(self, patterns: str | Sequence[str], until_step: int | None = None) -> None:
        self.patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        if not self.patterns:
            raise UsageError("Freeze needs at least one name pattern, e.g. Freeze('*embed*')")
        self.until_step = until_step
        self.frozen: list[str] = []
        self._state: ModelState | None = None

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})

    def on_setup(self, driver: DriverView) -> None:
        self._state = driver.backend.model_state()
        names = [p.name for p in self._state.parameters()]
        here = [any(matches(name, pattern) for name in names) for pattern in self.patterns]
        # every rank's names: a pipeline stage or shard may hold none of a pattern's
        # parameters, while another holds them; all ranks refuse alike, or none does
        anywhere = driver.backend.all_reduce_flags(here)
        for pattern, matched in zip(self.patterns, anywhere, strict=True):
            if not matched:
                raise UsageError(
                    f"Freeze: pattern {pattern!r} matches no parameter on any rank; the "
                    f"names are like {', '.join(names[:4])} ({len(names)} on this rank)"
                )

    def wanted(self, step: int) -> bool:
        """Whether step ``step`` (1-based) trains with the parameters frozen."""
        return self.until_step is None or step <= self.until_step

    def on_step_start(self, driver: DriverView) -> None:
        if self._state is None:
            return
        frozen = self.wanted(driver.step + 1)
        if frozen and not self.frozen:
            self.frozen = self._state.freeze(self.patterns)
        elif not frozen and self.frozen:
            self._state.unfreeze(self.frozen)
            self.frozen = []

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        metrics["freeze/frozen"] = float(len(self.frozen))

    def state_dict(self) -> dict[str, Any]:
        return {"patterns": self.patterns, "until_step": self.until_step, "frozen": self.frozen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # the backend's mask is not in its checkpoint: the next step start freezes anew
        self.frozen = []
