"""Checkpoints uploaded to object storage in the background, and resumed from there.

Example::

    from baton.callbacks import Checkpoint, CheckpointUpload

    Driver(backend, [Checkpoint(every_n_steps=500, keep_last=2),
                     CheckpointUpload("s3://bucket/runs/x")],
           run_dir="runs/x", resume="auto")

or, for any recipe, ``baton run recipe.py --checkpoint-upload s3://bucket/runs/x
--resume auto`` (needs ``baton-callbacks[s3]``).

- Every checkpoint is written to the local run directory first, as without this
  callback (atomic rename, checksummed ``baton.json``). Once complete, rank 0 links
  its files into a staging directory (hard links: no copy, and rotation may delete the
  original meanwhile) and a background thread uploads them; the loop is not blocked.
- The upload is verified object by object against ``baton.json`` (sizes; with
  ``verify="full"`` the xxh3-128 of each object read back), ``baton.json`` goes last,
  and only then does the bucket's ``latest`` name the checkpoint: a process killed
  mid-upload leaves ``latest`` on the previous complete checkpoint.
- Rotation (``Checkpoint(keep_last=...)``) deletes in the bucket too, after the
  uploads queued before it; after a fetch, older checkpoints only the bucket holds go
  with the first one rotation drops (scored ones stay: ``keep_best`` may want them).
- Before the resume plan, the store is checked (a bad URL, missing credentials or an
  unreachable endpoint is a ``UsageError`` before anything is built), and with
  ``resume="auto"`` the bucket's newest complete checkpoint is downloaded and verified
  when the local run directory holds nothing as new. A fresh run (``resume="none"``)
  into a prefix that holds checkpoints is refused unless ``overwrite``.
- With several ranks the run directories need not be shared: every rank makes sure its
  run directory holds the bucket's newest complete checkpoint (``fetch_for_every_rank``:
  ranks sharing a directory, on one node or a shared filesystem, take turns on a file
  lock and download it once) and points ``latest`` at it, so all ranks plan the same
  checkpoint (the driver checks that they do before loading).
- The run's end waits for the uploads in flight; an upload that fails is logged as an
  error and the run goes on (the local checkpoint is complete).

Metric keys logged: none.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import shutil
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import baton.core.checkpoints.files as ckpt
from baton.callbacks.object_store import ObjectStore
from baton.core.callback import CHECKPOINT_PRIORITY, Callback
from baton.core.errors import UsageError
from baton.core.launch import Launch
from baton.core.options import check_verify
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, RunOptions

log = logging.getLogger("baton")

#: staging directories (hard links of checkpoints being uploaded) under ``checkpoints/``;
#: the ``.tmp-`` prefix makes them leftovers that ``Checkpoint`` cleans after a crash
STAGING_PREFIX = f"{ckpt.TMP_PREFIX}upload-"
#: the lock ranks sharing a run directory take in turn to fetch from the store
FETCH_LOCK = ".baton-fetch.lock"


@CALLBACKS.register("checkpoint_upload")
class CheckpointUpload(Callback):
    """Upload each complete checkpoint to ``url`` in the background; resume from there.

    Args:
        url: where the run's checkpoints go (``s3://bucket/prefix``; one prefix per run).
        verify: how an upload is checked: ``"full"`` reads every object back and
            compares its xxh3-128 with ``baton.json``; ``"size"`` compares sizes only.
        storage_options: passed to fsspec (``{"endpoint_url": ...}``, ``{"anon": True}``).
    """

    # before Checkpoint's rotation: a checkpoint's upload is queued before the deletes
    # it causes, so the bucket's ``latest`` never names a deleted checkpoint
    priority = CHECKPOINT_PRIORITY - 1

    def __init__(
        self,
        url: str,
        *,
        verify: str = "full",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.verify = check_verify(verify)
        self.storage_options = dict(storage_options or {})
        #: checkpoint names whose upload was verified and made ``latest``, in order
        self.uploaded: list[str] = []
        #: what went wrong with uploads or remote deletes (logged as errors)
        self.errors: list[str] = []
        self._store: ObjectStore | None = None
        self._queue: queue.Queue[tuple[str, str, Path | None] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._removed: set[str] = set()
        self._deferred: set[str] = set()
        self._remote_only: list[str] = []

    def __repr__(self) -> str:
        return f"CheckpointUpload({self.url!r})"

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = self.open_store()
        return self._store

    def open_store(self) -> ObjectStore:
        """The ``ObjectStore`` for ``url`` (a subclass may return a slower one in tests)."""
        return ObjectStore.open(self.url, self.storage_options)

    # -- before the resume plan (``baton.core.checkpoints.remote``) --------------------------------
    def prepare_remote(self, options: RunOptions, *, rank_zero: bool) -> None:
        """Check the store; with ``resume="auto"`` fetch its newest complete checkpoint:
        one process fetches it where its directory has nothing as new; with several
        ranks every rank fetches it into its directory where that lacks it."""
        several = options.resume == "auto" and Launch.from_env().world_size > 1
        if not (rank_zero or several):
            return
        store = self.store
        store.check()
        checkpoint_dir = ckpt.checkpoints_dir(options.run_dir)
        if rank_zero and not options.resumes:
            remote = store.names()
            if remote and not options.overwrite:
                raise UsageError(
                    f"{self.url} already holds checkpoints (newest {remote[-1]}); continue "
                    "them with --resume auto, upload this run to another prefix, or pass "
                    "--overwrite (new checkpoints replace the bucket's latest)"
                )
            return
        if options.resume != "auto":
            return
        if several:
            self.fetch_for_every_rank(store, checkpoint_dir)
        else:
            self._fetch_newest(store, checkpoint_dir)

    def fetch_for_every_rank(self, store: ObjectStore, checkpoint_dir: Path) -> Path | None:
        """Several ranks: put the bucket's newest complete checkpoint in
        ``checkpoint_dir`` and point ``latest`` at it; returns its local path (``None``
        when the bucket holds none: the local checkpoints stay as they are).

        Every node reads the same bucket, and no rank writes to it before this attempt
        saves, so every rank picks the same checkpoint without talking to the others
        (the driver compares the ranks' choices before loading). A local copy is used
        where its ``baton.json`` is the bucket's, byte for byte; ranks sharing the
        directory (one node, a shared filesystem) take turns on ``FETCH_LOCK`` and only
        the first downloads. A local checkpoint newer than the bucket's (its upload was
        cut short) is not resumed from: the other nodes do not have it.
        """
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(checkpoint_dir / FETCH_LOCK):
            names = store.resume_order()
            for name in names:
                try:
                    path = self._local_copy(store, checkpoint_dir / name)
                    if path is None:
                        path = store.download(name, checkpoint_dir, self.verify)
                        log.info("fetched checkpoint %s from %s", path, self.url)
                except ckpt.CheckpointError as error:
                    log.warning("skipping remote checkpoint: %s", error)
                    continue
                ckpt.update_latest(checkpoint_dir, path)
                newer = [
                    p.name
                    for p in ckpt.list_checkpoints(checkpoint_dir)
                    if _step(p.name) > _step(name)
                ]
                if newer:
                    log.warning(
                        "resuming from %s, the newest complete checkpoint in %s: the newer "
                        "local %s never reached the bucket, so other nodes cannot load it",
                        name,
                        self.url,
                        ", ".join(newer),
                    )
                return path
        if names:
            log.warning("%s holds no complete checkpoint: ranks plan from their own", self.url)
        return None

    def _local_copy(self, store: ObjectStore, local: Path) -> Path | None:
        """``local`` where it is complete and the bucket's checkpoint of that name."""
        if not (local / ckpt.META_FILE).is_file():
            return None
        if (local / ckpt.META_FILE).read_bytes() != store.meta_bytes(local.name):
            return None
        try:
            ckpt.read_meta(local, "size")  # the full check is the resume plan's
        except ckpt.CheckpointError:
            return None
        return local

    def _fetch_newest(self, store: ObjectStore, checkpoint_dir: Path) -> None:
        local = ckpt.list_checkpoints(checkpoint_dir)
        newest_local = (ckpt.checkpoint_step(local[-1]) or 0) if local else -1
        candidates = [
            n for n in store.resume_order() if (ckpt.checkpoint_step(Path(n)) or 0) > newest_local
        ]
        if not candidates:
            return
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        for name in candidates:
            try:
                path = store.download(name, checkpoint_dir, self.verify)
            except ckpt.CheckpointError as error:
                log.warning("skipping remote checkpoint: %s", error)
                continue
            log.info("fetched checkpoint %s from %s", path, self.url)
            return
        log.warning("%s holds no complete checkpoint newer than the local ones", self.url)

    # -- during the run ------------------------------------------------------------
    def on_checkpoint_saved(self, driver: DriverView, path: Path) -> None:
        if not driver.is_global_zero:
            return
        staged = path.with_name(f"{STAGING_PREFIX}{path.name}")
        link_tree(path, staged)
        self._removed.discard(path.name)
        self._submit(("upload", path.name, staged))

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        if not driver.is_global_zero:
            return
        # older checkpoints only the bucket holds (this machine fetched the newest one):
        # rotation knows the local ones, so they follow the first one it drops; scored
        # ones (keep_best may protect them) stay
        restored = int(checkpoint["step"])
        state: dict[str, Any] = checkpoint.get("callbacks", {}).get("checkpoint", {})
        scored = set(state.get("scores", {}))
        try:
            remote = self.store.names()
        except Exception as error:  # rotation in the bucket is not worth failing the run
            log.warning("cannot list %s (%r): older remote checkpoints stay", self.url, error)
            remote = []
        self._remote_only = [
            n
            for n in remote
            if _step(n) < restored and n not in scored and not (driver.checkpoint_dir / n).is_dir()
        ]

    def on_checkpoint_removed(self, driver: DriverView, path: Path) -> None:
        if not driver.is_global_zero:
            return
        older = [n for n in self._remote_only if _step(n) < _step(path.name)]
        self._remote_only = [n for n in self._remote_only if n not in older]
        for name in [*older, path.name]:
            self._removed.add(name)
            self._submit(("remove", name, None))

    def on_train_end(self, driver: DriverView) -> None:
        self.wait()

    def on_exception(self, driver: DriverView, error: BaseException) -> None:
        self.wait()  # the complete checkpoints reach the bucket still

    def on_teardown(self, driver: DriverView) -> None:
        self.wait()

    def wait(self) -> None:
        """Block until every queued upload and delete is done, and stop the thread."""
        if self._worker is None:
            return
        self._queue.put(None)
        self._worker.join()
        self._worker = None

    # -- the background thread -----------------------------------------------------
    def _submit(self, job: tuple[str, str, Path | None]) -> None:
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._work, name="baton-checkpoint-upload", daemon=True
            )
            self._worker.start()
        self._queue.put(job)

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            action, name, staged = job
            try:
                if action == "upload" and staged is not None:
                    self._upload(name, staged)
                elif action == "remove":
                    self._remove(name)
            except Exception as error:
                message = f"{action} of checkpoint {name} at {self.url} failed: {error!r}"
                log.error("%s (the local checkpoint is complete)", message)
                self.errors.append(message)
            finally:
                if staged is not None:
                    shutil.rmtree(staged, ignore_errors=True)

    def _upload(self, name: str, staged: Path) -> None:
        if name in self._removed:
            return  # rotated away before its turn came: a newer one is queued
        self.store.upload(staged, self.verify, name)
        self.store.set_latest(name)
        self.uploaded.append(name)
        log.info("checkpoint %s uploaded to %s (verified)", name, self.url)
        for waiting in sorted(self._deferred):
            self._remove(waiting)

    def _remove(self, name: str) -> None:
        if self.store.latest() == name:
            # rotated before a newer upload took ``latest`` over: deleted after that one
            self._deferred.add(name)
            return
        self._deferred.discard(name)
        self.store.remove(name)
        log.info("removed old checkpoint %s/%s", self.url, name)


def _step(name: str) -> int:
    return ckpt.checkpoint_step(Path(name)) or 0


@contextmanager
def _exclusive(path: Path) -> Generator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing), waiting for it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing drops the lock


def link_tree(source: Path, target: Path) -> None:
    """Hard-link every file of ``source`` into a new ``target`` (copy where links fail),
    so the upload reads a fixed snapshot whatever happens to ``source``."""
    if target.exists():
        shutil.rmtree(target)
    for root, _dirs, files in os.walk(source):
        here = target / Path(root).relative_to(source)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, here / name)
            except OSError:
                shutil.copy2(Path(root) / name, here / name)
