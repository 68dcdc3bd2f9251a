"""The driver's checkpoints: saving the run's state when the loop or a callback asks,
resuming at the start, loading and rolling back in the middle of a run (as TorchTitan
keeps a ``CheckpointManager`` beside its ``Trainer``). The loop decides *when*; this
decides *what* goes into ``baton.json`` and what comes back. It is handed what it works
on: the backend, the run's counters (a ``RunCounters`` it saves and restores), the
callbacks whose states it saves, and the hook dispatch; it never looks back at the
driver.

Example (what ``Driver`` does)::

    counters = RunCounters()
    manager = CheckpointManager(backend, checkpoint_dir, resumer, counters=counters,
                                callbacks=callbacks, dispatch=driver.dispatch)
    manager.resume(evaluating=False)               # before training: the planned checkpoint
    manager.save("every 100 steps", options, patches=["fix_x"], asynchronous=True)
    manager.saver.poll(block=False, agree=True)    # after each step
    manager.rollback(Path("runs/x/checkpoints/step_000050"))

``CheckpointSaver`` (``saving.py``) writes and completes checkpoints; ``Resumer``
(``resuming.py``) chooses, verifies and loads them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core.backend import Backend
from baton.core.callback import Callback
from baton.core.checkpoints.files import ROLLOUTS_DIR, CheckpointMismatch
from baton.core.checkpoints.resuming import Resumer, restore_callback_states
from baton.core.checkpoints.saving import CheckpointSaver, checkpoint_meta
from baton.core.options import RunOptions
from baton.core.rollouts.collaborator import Rollouts

log = logging.getLogger("baton")


@dataclass
class RunCounters:
    """How far the run is: what each checkpoint records and a load restores.

    >>> counters = RunCounters(step=3, tokens=96, samples=6, train_time_s=1.5)
    >>> RunCounters().restore(counters.to_meta()) or counters
    RunCounters(step=3, tokens=96, samples=6, train_time_s=1.5)
    """

    step: int = 0
    tokens: int = 0
    samples: int = 0
    train_time_s: float = 0.0

    def to_meta(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens": self.tokens,
            "samples": self.samples,
            "train_time_s": self.train_time_s,
        }

    def restore(self, meta: dict[str, Any]) -> None:
        """The counters a checkpoint's ``baton.json`` recorded."""
        self.step = int(meta["step"])
        self.tokens = int(meta["tokens"])
        self.samples = int(meta.get("samples", 0))
        self.train_time_s = float(meta.get("train_time_s", 0.0))


class CheckpointManager:
    """Saves, resumes, loads and rolls back one run.

    Args:
        backend: the run's backend (its native checkpoint, its facts).
        checkpoint_dir: where the run's checkpoints are.
        resumer: the resume ``startup.prepare`` planned.
        counters: the run's counters, saved in each checkpoint and restored by a load.
        callbacks: the callbacks whose states each checkpoint holds.
        dispatch: ``dispatch(hook, *args)``: the run's hooks (``on_save_checkpoint``,
            ``on_checkpoint_saved``, ``on_load_checkpoint``).
        rollouts: the rollout phase of a run that trains on rollouts (its state saved
            and restored with the run's), or ``None``.
    """

    def __init__(
        self,
        backend: Backend,
        checkpoint_dir: Path,
        resumer: Resumer,
        *,
        counters: RunCounters,
        callbacks: Sequence[Callback],
        dispatch: Callable[..., None],
        rollouts: Rollouts | None = None,
    ) -> None:
        self.backend = backend
        self.rollouts = rollouts
        self.resumer = resumer
        self.counters = counters
        self.callbacks = callbacks
        self.dispatch = dispatch
        #: the checkpoint whose callback states this run restored (resumed from)
        self.resumed_from: Path | None = None
        self.saver = CheckpointSaver(backend, checkpoint_dir, self._announce_saved)

    def save(
        self, reason: str, options: RunOptions, *, patches: list[str], asynchronous: bool
    ) -> None:
        """A checkpoint of the current step (in the background with ``asynchronous``),
        recording ``options`` and the ``patches`` applied."""
        self.saver.asynchronous = asynchronous
        self.saver.save(self.counters.step, lambda: self._meta(reason, options, patches))

    def _meta(self, reason: str, options: RunOptions, patches: list[str]) -> dict[str, Any]:
        """The ``baton.json`` of the checkpoint being written; ``on_save_checkpoint`` sees it."""
        meta = checkpoint_meta(
            reason=reason,
            counters=self.counters.to_meta(),
            backend=self.backend,
            callbacks=self.callbacks,
            options=options,
            resume_changes=self.resumer.changes,
            patches=patches,
        )
        if self.rollouts is not None and self.saver.writing is not None:
            directory = self.saver.writing / ROLLOUTS_DIR
            meta["rollouts"] = self.rollouts.save(directory, write=self.backend.rank == 0)
        self.dispatch("on_save_checkpoint", meta)
        return meta

    def _announce_saved(self, path: Path) -> None:
        self.dispatch("on_checkpoint_saved", path)

    def resume(self, *, evaluating: bool) -> Path | None:
        """Load the checkpoint the run resumes from, if any (counters, callback states);
        returns its path. ``evaluating``: an evaluation, not a resume (callbacks added
        or dropped are no news)."""
        loaded = self.resumer.resume()
        if loaded is None:
            return None
        self._restore(*loaded, callbacks=True, evaluating=evaluating)
        return loaded[0]

    def load(self, path: Path | None, *, callbacks: bool) -> Path:
        """Load the complete checkpoint ``path`` (``None``: the newest) in the middle of
        a run, after the saves in flight complete; callback states with ``callbacks``."""
        self.saver.poll(block=True)
        loaded, meta = self.resumer.load(path)
        self._restore(loaded, meta, callbacks=callbacks, evaluating=False)
        return loaded

    def rollback(self, path: Path) -> Path:
        """Forget the checkpoints after ``path`` (deleted by the resumer) and load it."""
        self.saver.poll(block=True)
        self.saver.forget_after(self.resumer.rewind(path))
        return self.load(path, callbacks=False)

    def _restore(
        self, path: Path, meta: dict[str, Any], *, callbacks: bool, evaluating: bool
    ) -> None:
        self.counters.restore(meta)
        step = self.counters.step
        if self.rollouts is not None:
            restore_rollouts(self.rollouts, path, meta)
        if callbacks:
            restore_callback_states(self.callbacks, meta, path, announce=not evaluating)
            self.resumed_from = path
            if evaluating:  # an evaluation, not a resume
                log.info("evaluating %s (step %d)", path, step)
            else:
                log.info("resumed from %s at step %d", path, step)
        else:
            log.info("rolled back to %s (step %d)", path, step)
        self.dispatch("on_load_checkpoint", meta)


def restore_rollouts(rollouts: Rollouts, path: Path, meta: dict[str, Any]) -> None:
    """The rollout phase's state as the checkpoint at ``path`` holds it (``meta`` its
    ``baton.json``); a checkpoint of a run without rollouts is refused."""
    state = meta.get("rollouts")
    if state is None:
        raise CheckpointMismatch(
            f"{path} holds no rollout state: it was written by a run that does not train "
            "on rollouts; resume from a checkpoint of this run, or start a new run (--run-dir)"
        )
    rollouts.load(path / ROLLOUTS_DIR, state)
