"""What a callback's hooks (and a patch's ``apply``) may read and call on the driver.

Every hook receives the running ``Driver`` as ``driver``; its type is this protocol, the
documented part of the loop a callback works with (as Lightning's hooks see a
documented ``Trainer``): the backend, the run's options and control flags, the
counters, where the run writes, and the few calls a callback makes (``record``,
``save_checkpoint``, ``rollback``, ...). ``Driver`` satisfies it structurally; this
module imports nothing that leads back to the loop, so ``callback.py`` and
``patches.py`` name it without tying themselves to ``driver.py``.

Example::

    from baton.core import Callback, DriverView

    class SaveAtLoss(Callback):
        '''Ask for a checkpoint the first time the loss drops below ``threshold``.'''

        def __init__(self, threshold: float) -> None:
            self.threshold, self.done = threshold, False

        def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
            if not self.done and metrics["loss"] < self.threshold:
                self.done = True
                driver.control.request_save(f"loss below {self.threshold} at {driver.step}")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from baton.core.abilities import Ability
from baton.core.backend import Backend
from baton.core.control import Control
from baton.core.options import RunOptions


class DriverView(Protocol):
    """The driver as a callback sees it: read what the run is and where it stands; ask
    through ``control`` (stop, save, evaluate, log at the next agreed point) or call the
    few methods below."""

    # -- what runs ------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The backend (its native ``config`` is editable in ``on_configure``)."""
        ...

    @property
    def options(self) -> RunOptions:
        """The run's options (``max_steps``, ``log_every``, ``run_dir``, ``settings``, ...)."""
        ...

    @property
    def control(self) -> Control:
        """The flags a callback raises: ``request_stop``, ``request_save``,
        ``request_eval``, ``request_log``, ``veto_save``."""
        ...

    @property
    def abilities(self) -> frozenset[Ability]:
        """The backend's optional abilities (known after ``backend.setup``)."""
        ...

    @property
    def evaluating_only(self) -> bool:
        """True when the run evaluates a checkpoint and trains nothing (``baton eval``)."""
        ...

    # -- where the run stands ----------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        ...

    @property
    def tokens(self) -> int:
        """Tokens trained on, over every rank."""
        ...

    @property
    def samples(self) -> int:
        """Samples trained on, over every rank."""
        ...

    @property
    def train_time_s(self) -> float:
        """Wall time spent training."""
        ...

    @property
    def eval_time_s(self) -> float:
        """Wall time this process spent in evaluation."""
        ...

    @property
    def save_blocking_s(self) -> float:
        """Wall time this process spent blocked in checkpoint saves."""
        ...

    @property
    def is_global_zero(self) -> bool:
        """Whether this is rank 0."""
        ...

    # -- where the run writes ------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        """The run's checkpoints (``RUN_DIR/checkpoints``)."""
        ...

    @property
    def log_dir(self) -> Path:
        """The run's logs (``RUN_DIR/logs``)."""
        ...

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this run resumed from, or ``None``."""
        ...

    @property
    def checkpoint_being_written(self) -> Path | None:
        """The checkpoint being written, for ``on_save_checkpoint`` (a callback's own
        files go in a folder of its own there)."""
        ...

    @property
    def saved(self) -> list[Path]:
        """The checkpoints this run completed, oldest first."""
        ...

    # -- what a callback calls -----------------------------------------------------------
    def record(self, name: str, value: Any) -> None:
        """Add a lazy value to the next log step's single host transfer."""
        ...

    def dispatch(self, hook: str, *args: Any) -> None:
        """Call ``hook(driver, *args)`` on every callback that overrides it, in order."""
        ...

    def configure_saving(
        self, *, on_stop: bool | None = None, asynchronous: bool | None = None
    ) -> None:
        """Set the save policy (in ``on_configure`` or ``on_setup``)."""
        ...

    def save_checkpoint(self, reason: str = "requested") -> None:
        """Write a checkpoint of the current step now."""
        ...

    def wait_for_saves(self) -> None:
        """Block until every checkpoint still being written is complete (on every rank)."""
        ...

    def load_checkpoint(self, path: str | Path | None = None, *, callbacks: bool = False) -> Path:
        """Restore a complete checkpoint in the middle of a run (from ``on_step_start``)."""
        ...

    def rollback(self, path: str | Path) -> Path:
        """Go back to the checkpoint ``path``, deleting the newer ones (from
        ``on_step_start``)."""
        ...
