"""Requests from callbacks to the loop: stop, save, evaluate, log.

A callback calls ``driver.control.request_stop("loss is NaN")``; the loop reads the
flags after the step's end, log and eval events, acts on them and resets them. Under
several processes, flags are OR-reduced across ranks at the log cadence only (never a
collective on every step). A request that every rank makes at the same step for the
same reason (a fixed schedule) passes ``all_ranks=True`` and is acted on at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton.core.options import RunOptions

FLAGS = ("stop", "save", "eval", "log")


@dataclass
class Control:
    """The requests of the current step. ``stop``, ``save``, ``eval`` and ``log`` read
    whether a flag is requested; ``reasons`` holds the requested flags, each with the
    reasons given (a step nobody asked anything of leaves it empty, and the loop's
    reading of it costs next to nothing)."""

    #: the requested flags, each with its reasons
    reasons: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    #: flags every rank agrees on without a collective
    agreed: set[str] = field(default_factory=set[str])
    #: why this step's state must not be saved at all (``veto_save``), or ``None``
    save_vetoed: str | None = None

    @property
    def stop(self) -> bool:
        return "stop" in self.reasons

    @property
    def save(self) -> bool:
        return "save" in self.reasons

    @property
    def eval(self) -> bool:
        return "eval" in self.reasons

    @property
    def log(self) -> bool:
        return "log" in self.reasons

    @property
    def idle(self) -> bool:
        """Nothing requested and no save vetoed: the loop has nothing to act on."""
        return not self.reasons and self.save_vetoed is None

    def _request(self, flag: str, reason: str, all_ranks: bool) -> None:
        self.reasons.setdefault(flag, []).append(reason)
        if all_ranks:
            self.agreed.add(flag)

    def request_stop(self, reason: str, *, all_ranks: bool = False) -> None:
        """Stop after this step (a checkpoint is written if a save was also asked)."""
        self._request("stop", reason, all_ranks)

    def request_save(self, reason: str, *, all_ranks: bool = False) -> None:
        """Write a checkpoint after this step."""
        self._request("save", reason, all_ranks)

    def request_eval(self, reason: str, *, all_ranks: bool = False) -> None:
        """Run evaluation after this step."""
        self._request("eval", reason, all_ranks)

    def request_log(self, reason: str, *, all_ranks: bool = False) -> None:
        """Materialise and log metrics for this step even off the log cadence."""
        self._request("log", reason, all_ranks)

    def request_stop_at_limits(
        self, options: RunOptions, step: int, tokens: int, train_time_s: float
    ) -> None:
        """After a step: stop (and log the last step) at one of the run's limits. Every
        rank counts steps and tokens alike; wall clocks differ, so a time limit waits
        for the next log step, where the ranks agree."""
        for reason in options.limits_reached(step, tokens):
            self.request_stop(reason, all_ranks=True)
            self.request_log("last step", all_ranks=True)
        if (reason := options.time_limit_reached(train_time_s)) is not None:
            self.request_stop(reason)
            self.request_log("time limit")

    def withdraw(self, flag: str) -> None:
        """Cancel a request of this step (a guard vetoing the save of a broken state).
        Under several ranks, withdraw only what every rank decides to withdraw alike."""
        if flag not in FLAGS:
            raise ValueError(f"unknown control flag {flag!r}; flags: {', '.join(FLAGS)}")
        self.reasons.pop(flag, None)
        self.agreed.discard(flag)

    def veto_save(self, reason: str) -> None:
        """This step's state must not be saved: withdraw a save request and skip the
        save-on-stop too (a guard that found a broken state). Cleared after the step.
        Under several ranks, veto only what every rank decides alike."""
        self.withdraw("save")
        self.save_vetoed = reason

    def reason(self, flag: str) -> str:
        """The reasons given for ``flag``, joined; empty when none."""
        return "; ".join(self.reasons.get(flag, []))

    def is_set(self, flag: str) -> bool:
        """Whether ``flag`` (one of ``FLAGS``) is requested."""
        return flag in self.reasons

    def as_list(self) -> list[bool]:
        return [f in self.reasons for f in FLAGS]

    def merge(self, reduced: list[bool]) -> None:
        """Adopt flags OR-reduced across ranks; a flag set elsewhere gets a reason here."""
        for flag, value in zip(FLAGS, reduced, strict=True):
            if value and flag not in self.reasons:
                self.reasons[flag] = ["requested on another rank"]

    # -- how the loop reads the flags (``Driver`` after each step) --------------------
    def acting(self, *, ranks: int, agree: Callable[[list[bool]], list[bool]] | None) -> set[str]:
        """Flags to act on now. With several ranks, flags not every rank raised wait
        for the log cadence, where the loop passes ``agree`` (an OR-reduction over the
        ranks) and every rank adopts the union."""
        if ranks > 1:
            if agree is None:
                return {f for f in self.agreed if f in self.reasons}
            self.merge(agree(self.as_list()))
        return set(self.reasons)

    def acting_after_events(self, acting: set[str], *, ranks: int) -> set[str]:
        """Stop and save requests made while logging or evaluating (a NaN guard, early
        stopping) act at this step; a request withdrawn there (``withdraw``) does not.
        With several ranks only requests every rank made (``all_ranks``) join now."""
        if not self.reasons:
            return set()
        acting = {f for f in acting if f in self.reasons}
        for flag in ("stop", "save"):
            if flag in self.reasons and (ranks == 1 or flag in self.agreed):
                acting.add(flag)
        return acting

    def clear(self, flags: set[str]) -> None:
        """Reset the flags acted on, and this step's save veto."""
        for flag in flags:
            self.withdraw(flag)
        self.save_vetoed = None
