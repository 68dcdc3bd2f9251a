"""Roll back to the last good checkpoint: the part both guards share.

A guard (``LossGuard``, ``CorruptionCheck``) marks the steps it found healthy. When it
finds a broken state it refuses the state's save and learns the newest checkpoint saved
at or before the last healthy step; where it rolls back, the driver goes back to that
checkpoint at the start of the next step (``driver.rollback`` must run from
``on_step_start``)::

    last_good = LastGood()
    last_good.mark(driver.step)                       # a step checked healthy
    good = last_good.refuse_save(driver.control, "NaN loss", driver.checkpoint_dir)
    if good is not None:
        last_good.roll_back_at_next_step(driver.step)
    # in on_step_start:
    bad_step = last_good.roll_back_if_due(driver.checkpoint_dir, driver.rollback)

The checkpoint is looked up again at the rollback, so a save that completed in between
(at or before the last healthy step) is the one gone back to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.core.checkpoints import files as ckpt

if TYPE_CHECKING:
    from baton.core.control import Control


class LastGood:
    """The last step known healthy, and a rollback to the newest checkpoint at or before
    it, planned for the next step's start."""

    def __init__(self) -> None:
        #: the last step checked healthy (a loaded or resumed step counts as checked)
        self.step = 0
        self._planned_at: int | None = None

    def mark(self, step: int) -> None:
        """``step`` is healthy."""
        self.step = step

    def checkpoint(self, checkpoint_dir: Path) -> tuple[Path, dict[str, Any]] | None:
        """The newest complete checkpoint under ``checkpoint_dir`` saved at or before the
        last healthy step, with its metadata; ``None`` where there is none."""
        for path, meta in ckpt.resumable(checkpoint_dir):
            if int(meta["step"]) <= self.step:
                return path, meta
        return None

    def refuse_save(
        self, control: Control, reason: str, checkpoint_dir: Path
    ) -> tuple[Path, dict[str, Any]] | None:
        """Refuse to save this step's state, now or on the way out (``reason`` says why);
        returns the checkpoint a rollback would go back to (``checkpoint``)."""
        control.veto_save(reason)
        return self.checkpoint(checkpoint_dir)

    def roll_back_at_next_step(self, bad_step: int) -> None:
        """Go back at the next step's start (``roll_back_if_due``); ``bad_step`` is the step
        the broken state was found at."""
        self._planned_at = bad_step

    def roll_back_if_due(
        self, checkpoint_dir: Path, rollback: Callable[[Path], object]
    ) -> int | None:
        """Where a rollback is planned, go back (``rollback``, the driver's) to the newest
        checkpoint at or before the last healthy step and return the step the broken
        state was found at; ``None`` where none is planned."""
        if self._planned_at is None:
            return None
        bad_step, self._planned_at = self._planned_at, None
        good = self.checkpoint(checkpoint_dir)
        if good is None:  # refuse_save found one; a newer save only prunes older ones
            raise RuntimeError(f"no checkpoint at or before step {self.step} to roll back to")
        rollback(good[0])
        return bad_step
