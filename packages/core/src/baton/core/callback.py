"""The callback base class: every hook is a documented no-op.

A callback overrides only the hooks it needs; the driver finds those once, at the
start of a run, and never calls the others, so an unused hook costs nothing.

Example::

    from baton.core import Callback, DriverView

    class PrintLoss(Callback):
        '''Print the loss on every log step.'''

        def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
            print(driver.step, metrics["loss"])

``on_log`` carries training metrics only; evaluation results arrive in
``on_eval_end``. A callback that needs an optional backend ability (``skip_data``,
``evaluate``, ...) returns it from ``requires``; the run then fails before its first
step on a backend without it.

Stateful callbacks set a unique ``state_key`` and implement ``state_dict`` /
``load_state_dict``; their state travels in every checkpoint (it must be JSON
serialisable) and comes back on resume.

Every hook receives the running driver as a ``DriverView`` (``driver_view.py``): the
documented part of the loop a callback reads and calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from baton.core.abilities import Ability
    from baton.core.driver_view import DriverView
    from baton.core.metrics import StepOutput
    from baton.core.rollouts.collaborator import RolloutRecord

# Priorities where the order of callbacks matters (lower runs first on entry hooks and
# last on exit hooks; the default is 0). Each says why it sits where it does.

#: patches change the backend before any callback sees it, and unwind last
PATCH_PRIORITY = -1000
#: monitors add metric keys in ``on_log`` that guards, checkpoint scoring and loggers read
METRIC_PRIORITY = 10
#: signals and time limits request save + stop in ``on_step_end``, before a guard checks
#: the step that saves
STOP_REQUEST_PRIORITY = 50
#: periodic save requests in ``on_step_end`` (before guards); scores read after monitors
CHECKPOINT_PRIORITY = 100
#: guards and early stopping see every save request of the step (so a saving step is
#: checked first and a broken state's save is vetoed) and every monitor's keys
GUARD_PRIORITY = 150
#: displays show every key the callbacks before them added
DISPLAY_PRIORITY = 200
#: loggers write last, when every key is in
LOGGER_PRIORITY = 250


class Callback:
    """Base class of every baton callback (and every patch)."""

    #: Lower runs first on entry hooks and last on exit hooks.
    priority: ClassVar[int] = 0
    #: Set to a unique string to have ``state_dict`` saved in checkpoints.
    state_key: str | None = None

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return JSON-serialisable state to save in each checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (called on resume)."""

    def requires(self) -> frozenset[Ability]:
        """Optional backend abilities this callback needs (``"skip_data"``, ``"evaluate"``,
        ``"async_save"``, ``"multi_rank"``, ``"model_state"``); checked once before the
        first step."""
        return frozenset()

    # -- hooks -----------------------------------------------------------------
    def on_configure(self, driver: DriverView) -> None:
        """Before anything is built: edit ``driver.backend.config`` (the native config)."""

    def on_setup(self, driver: DriverView) -> None:
        """The backend built its model, optimizer, data and step function."""

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        """A checkpoint was restored; ``checkpoint`` is its ``baton.json`` content."""

    def on_train_start(self, driver: DriverView) -> None:
        """The loop is about to run its first step (after any resume)."""

    def on_step_start(self, driver: DriverView) -> None:
        """Step ``driver.step + 1`` is about to run."""

    def on_rollout_end(self, driver: DriverView, rollouts: Sequence[RolloutRecord]) -> None:
        """New rollouts are ready for step ``driver.step + 1`` (a run that trains on
        rollouts; every rank, the same records): one record per completion, with its
        rewards and advantage. Not called on a step that reuses the last rollouts."""

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        """A step finished. ``output`` holds lazy backend values: reading them syncs."""

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        """Host-side training metrics of a log step (never evaluation results).
        Callbacks may add keys for later callbacks."""

    def on_eval_start(self, driver: DriverView) -> None:
        """Evaluation is about to run."""

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        """Evaluation finished with these host-side metrics (keys ``eval/...``).
        Callbacks may add keys for later callbacks."""

    def on_save_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        """A checkpoint is being written; entries added to ``checkpoint`` go to ``baton.json``."""

    def on_checkpoint_saved(self, driver: DriverView, path: Path) -> None:
        """The checkpoint at ``path`` is complete on disk (and is now ``latest``)."""

    def on_checkpoint_removed(self, driver: DriverView, path: Path) -> None:
        """Rotation dropped the checkpoint at ``path`` (deleted on rank 0); copies kept
        elsewhere (object storage) follow."""

    def on_train_end(self, driver: DriverView) -> None:
        """The loop ended normally (stop condition or stop request)."""

    def on_exception(self, driver: DriverView, error: BaseException) -> None:
        """Something raised during the run; teardown follows."""

    def on_teardown(self, driver: DriverView) -> None:
        """Always runs last, in reverse order: release what ``on_configure``/``on_setup`` took."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
