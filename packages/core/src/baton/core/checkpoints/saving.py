"""Writing checkpoints: where, synchronously or in the background, and how a save
becomes complete (durable, renamed, ``latest``) on every rank.

The loop decides *when* (a callback's request, a stop); a ``CheckpointSaver`` does the
rest::

    saver = CheckpointSaver(backend, ckpt.checkpoints_dir(run_dir), on_saved=announce)
    saver.asynchronous = True               # where the backend has ``async_save``
    saver.save(step, lambda: meta)          # writes, or starts writing, step_000100
    saver.poll(block=False, agree=True)     # after each step: finish what is written
    saver.poll(block=True)                  # at the end: wait for every save

A save is written under ``.tmp-step_N`` (the backend's files in ``backend/``), then
``checkpointing.finalize`` fsyncs it, writes ``baton.json`` with the files' checksums,
renames it to ``step_N`` and points ``latest`` at it (rank 0, between barriers). An
asynchronous save is hashed on a background thread once written, so the loop never
waits for checksums; with several ranks, ranks agree that every part is written with
one small all-reduce at the log cadence and finish it together. ``on_saved(path)`` is
called on every rank when a checkpoint is complete; rotation (the ``Checkpoint``
callback) takes over from there.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import baton.core.checkpoints.files as ckpt
from baton.core.backend import Backend, PendingSave
from baton.core.callback import Callback
from baton.core.checkpoints.run_record import versions
from baton.core.options import RunOptions

log = logging.getLogger("baton")


@dataclass
class _PendingCheckpoint:
    tmp: Path
    final: Path
    meta: dict[str, Any]
    handle: PendingSave | None
    #: the backend files' manifest, hashed off the training thread (async saves)
    files: Future[dict[str, Any]] | None = None


class CheckpointSaver:
    """Writes checkpoints under ``checkpoint_dir`` and completes them on every rank.

    Args:
        backend: writes its native state (``backend.save``) and provides the barriers.
        checkpoint_dir: ``run_dir/checkpoints``.
        on_saved: called with the final path once a checkpoint is complete.

    ``asynchronous`` (set before training: the run's ``async_save`` where the backend
    has the ability) makes ``backend.save`` return a handle the loop polls.
    ``saved`` lists the checkpoints this run completed; ``blocking_s`` the wall time
    the loop spent blocked in saves (an async save's background write is not counted).
    """

    def __init__(
        self, backend: Backend, checkpoint_dir: Path, on_saved: Callable[[Path], None]
    ) -> None:
        self.backend = backend
        self.checkpoint_dir = checkpoint_dir
        self.on_saved = on_saved
        self.asynchronous = False
        self.saved: list[Path] = []
        #: the directory of the checkpoint being written (set before ``snapshot()``)
        self.writing: Path | None = None
        self.blocking_s = 0.0
        self._pending: list[_PendingCheckpoint] = []
        self._hasher: ThreadPoolExecutor | None = None

    @property
    def _global_zero(self) -> bool:
        return self.backend.rank == 0

    def save(self, step: int, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Write the checkpoint of ``step`` (once per step); ``snapshot()`` returns its
        ``baton.json`` content, taken after every rank has made room for it. A
        synchronous save is complete on return; an asynchronous one when ``poll`` finds
        it written."""
        started = time.perf_counter()
        try:
            self._save(step, snapshot)
        finally:
            self.blocking_s += time.perf_counter() - started

    def _save(self, step: int, snapshot: Callable[[], dict[str, Any]]) -> None:
        final = self.checkpoint_dir / ckpt.checkpoint_name(step)
        if any(p.final.name == final.name for p in self._pending) or (
            self.saved and self.saved[-1].name == final.name
        ):
            return  # this step is already saved or being saved
        tmp = self.checkpoint_dir / f"{ckpt.TMP_PREFIX}{final.name}"
        if self._global_zero:
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / ckpt.BACKEND_DIR).mkdir(parents=True)
        self.backend.barrier()
        self.writing = tmp
        meta = snapshot()
        try:
            handle = self.backend.save(tmp / ckpt.BACKEND_DIR, asynchronous=self.asynchronous)
        except BaseException:
            # a failed write leaves no half-checkpoint behind; the complete ones stay
            if self._global_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._pending.append(_PendingCheckpoint(tmp, final, meta, handle))
        if handle is None:
            self.poll(block=True)

    def poll(self, *, block: bool, agree: bool = True, collective: bool = True) -> None:
        """Finish saves whose writes are done: rename, ``latest``, ``on_saved``.

        ``block`` waits for every save in flight. Otherwise, with several ranks, ranks
        ask each other whether a save is written only when ``agree`` (the loop passes
        its log cadence: no collective on every step). ``collective=False`` (the error
        path, which may run on one rank alone) waits locally and uses no barrier.
        """
        if not self._pending:
            return
        multi = collective and self.backend.world_size > 1
        while self._pending:
            item = self._pending[0]
            if item.handle is not None and not block:
                if item.files is None and not self._all_written(item, multi, agree):
                    return
                if not multi and self._global_zero and not self._hashed(item):
                    return  # written; its checksums are computed in the background
            self._pending.pop(0)
            self._complete(item, multi)

    def _complete(self, item: _PendingCheckpoint, multi: bool) -> None:
        if item.handle is not None:
            try:
                item.handle.wait()
            except BaseException:
                if self._global_zero:
                    shutil.rmtree(item.tmp, ignore_errors=True)
                raise
            if not multi and self._global_zero:
                self._hashed(item)  # an asynchronous save is always hashed off-thread
        if item.handle is None or multi:
            self.backend.barrier()
        if self._global_zero:
            files = item.files.result() if item.files is not None else None
            ckpt.finalize(item.tmp, item.final, item.meta, files)
            log.info("checkpoint %s saved (%s)", item.final, item.meta["reason"])
        if item.handle is None or multi:
            self.backend.barrier()
        self.saved.append(item.final)
        self.on_saved(item.final)

    def _hashed(self, item: _PendingCheckpoint) -> bool:
        """Start hashing a written asynchronous save off the training thread; whether
        its manifest is ready."""
        if item.files is None:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(1, thread_name_prefix="baton-checksum")
            item.files = self._hasher.submit(ckpt.manifest, item.tmp / ckpt.BACKEND_DIR)
        return item.files.done()

    def _all_written(self, item: _PendingCheckpoint, multi: bool, agree: bool) -> bool:
        assert item.handle is not None
        if not multi:
            return item.handle.done()
        if not agree:
            return False  # ranks agree only at the log cadence: no collective per step
        unfinished = self.backend.all_reduce_flags([not item.handle.done()])
        return not unfinished[0]

    def forget_after(self, step: int) -> None:
        """Drop the checkpoints newer than ``step`` from ``saved`` (a rollback deleted
        them)."""
        self.saved = [p for p in self.saved if (ckpt.checkpoint_step(p) or 0) <= step]

    def close(self) -> None:
        """Stop the hashing thread (after the last ``poll``)."""
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
            self._hasher = None


def checkpoint_meta(
    *,
    reason: str,
    counters: dict[str, Any],
    backend: Backend,
    callbacks: Sequence[Callback],
    options: RunOptions,
    resume_changes: list[dict[str, Any]],
    patches: list[str],
) -> dict[str, Any]:
    """A checkpoint's ``baton.json`` (before ``finalize`` adds its files): ``counters``
    (step, tokens, samples, train_time_s), why it was written, the backend's facts
    (``describe()``, and its layout, data position and data fingerprint: ``checkpoint``),
    each stateful callback's state, the settings and limits it was trained with, the
    allowed changes so far, the patches applied and the versions installed."""
    states = {cb.state_key: cb.state_dict() for cb in callbacks if cb.state_key is not None}
    return {
        "format": 2,
        **counters,
        "reason": reason,
        "saved_at": time.time(),
        "backend": {
            "name": backend.name,
            "version": backend.version,
            "world_size": backend.world_size,
            **backend.describe(),
        },
        "checkpoint": backend.checkpoint_facts().to_json(),
        "callbacks": states,
        "settings": options.settings,
        "driver": options.limits(),
        "resume_changes": resume_changes,
        "patches": patches,
        "versions": versions(backend),
    }
