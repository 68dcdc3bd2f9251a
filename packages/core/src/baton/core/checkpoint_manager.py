"""The driver's checkpoints: saving the run's state when the loop or a callback asks,
resuming at the start, loading and rolling back in the middle of a run, with the
driver's counters and callbacks (as TorchTitan keeps a ``CheckpointManager`` beside its
``Trainer``). The loop decides *when*; this decides *what* goes into ``baton.json`` and
what comes back.

Example (what ``Driver`` does)::

    manager = CheckpointManager(driver, resumer)   # built when the run is prepared
    manager.resume()                               # before training: the planned checkpoint
    manager.save("every 100 steps")                # writes (or starts writing) step_000100
    manager.saver.poll(block=False, agree=True)    # after each step
    manager.rollback("runs/x/checkpoints/step_000050")

``CheckpointSaver`` (``saving.py``) writes and completes checkpoints; ``Resumer``
(``resuming.py``) chooses, verifies and loads them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.core.resuming import Resumer, restore_callback_states
from baton.core.saving import CheckpointSaver, checkpoint_meta

if TYPE_CHECKING:
    from baton.core.driver import Driver

log = logging.getLogger("baton")


class CheckpointManager:
    """Saves, resumes, loads and rolls back one driver's run.

    Args:
        driver: the run: its backend, options, counters (``step``, ``tokens``,
            ``samples``, ``train_time_s``), callbacks and hooks.
        resumer: the resume ``startup.prepare`` planned.
    """

    def __init__(self, driver: Driver, resumer: Resumer) -> None:
        self.driver = driver
        self.resumer = resumer
        self.saver = CheckpointSaver(driver.backend, driver.checkpoint_dir, self._announce_saved)

    def save(self, reason: str) -> None:
        """A checkpoint of the current step, in the background where the run asked for
        it and the backend has ``async_save``."""
        driver = self.driver
        self.saver.asynchronous = driver.options.async_save and "async_save" in driver.abilities
        self.saver.save(driver.step, lambda: self._meta(reason))

    def _meta(self, reason: str) -> dict[str, Any]:
        """The ``baton.json`` of the checkpoint being written; ``on_save_checkpoint`` sees it."""
        driver = self.driver
        meta = checkpoint_meta(
            reason=reason,
            counters={
                "step": driver.step,
                "tokens": driver.tokens,
                "samples": driver.samples,
                "train_time_s": driver.train_time_s,
            },
            backend=driver.backend,
            callbacks=driver.callbacks,
            options=driver.options,
            resume_changes=self.resumer.changes,
            patches=[d.name for d in driver.patch_report if d.applied],
        )
        driver.dispatch("on_save_checkpoint", meta)
        return meta

    def _announce_saved(self, path: Path) -> None:
        self.driver.dispatch("on_checkpoint_saved", path)

    def resume(self) -> None:
        """Load the checkpoint the run resumes from, if any (counters, callback states)."""
        loaded = self.resumer.resume()
        if loaded is not None:
            self._restore(*loaded)

    def load(self, path: Path | None, *, callbacks: bool) -> Path:
        """Load the complete checkpoint ``path`` (``None``: the newest) in the middle of
        a run, after the saves in flight complete; callback states with ``callbacks``."""
        self.saver.poll(block=True)
        loaded, meta = self.resumer.load(path)
        self._restore(loaded, meta, callbacks=callbacks)
        return loaded

    def rollback(self, path: Path) -> Path:
        """Forget the checkpoints after ``path`` (deleted by the resumer) and load it."""
        self.saver.poll(block=True)
        self.saver.forget_after(self.resumer.rewind(path))
        return self.load(path, callbacks=False)

    def _restore(self, path: Path, meta: dict[str, Any], *, callbacks: bool = True) -> None:
        driver = self.driver
        driver.step = int(meta["step"])
        driver.tokens = int(meta["tokens"])
        driver.samples = int(meta.get("samples", 0))
        driver.train_time_s = float(meta.get("train_time_s", 0.0))
        if callbacks:
            # an evaluation trains nothing: callbacks added or dropped are no news
            restore_callback_states(
                driver.callbacks, meta, path, announce=not driver.evaluating_only
            )
            driver.resumed_from = path
            if driver.evaluating_only:  # an evaluation, not a resume
                log.info("evaluating %s (step %d)", path, driver.step)
            else:
                log.info("resumed from %s at step %d", path, driver.step)
        else:
            log.info("rolled back to %s (step %d)", path, driver.step)
        driver.dispatch("on_load_checkpoint", meta)


class SavingAttributes:
    """What callbacks read about the run's saves (``driver.saved``, ...)."""

    _checkpoints: CheckpointManager

    @property
    def checkpoint_being_written(self) -> Path | None:
        """The directory of the checkpoint being written, for ``on_save_checkpoint``: a
        callback writes state too large for ``baton.json`` there, in a folder of its own
        beside ``backend/`` (``EMA`` writes ``ema/``); on resume it reads it back from
        ``resumed_from``. ``None`` before the first save."""
        return self._checkpoints.saver.writing

    @property
    def saved(self) -> list[Path]:
        """The checkpoints this run completed, oldest first."""
        return self._checkpoints.saver.saved

    @property
    def save_blocking_s(self) -> float:
        """Wall time this process spent blocked in checkpoint saves (an async save's
        background write is not counted), for honest throughput."""
        return self._checkpoints.saver.blocking_s
