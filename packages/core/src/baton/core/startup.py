"""Checks a run makes before anything is built, and the abilities it needs after.

``Driver.fit`` calls ``prepare`` first: each step raises a ``UsageError`` (or
``CheckpointError``) naming the problem and the fix, before the backend builds
anything or a file is written (a run directory this run created is removed again)::

    start = prepare(backend, callbacks, options)
    start.options        # a restarted job (torchrun, SLURM requeue) resumes "auto"
    start.callbacks      # the backend's selected patches first, then the user's
    start.lock           # rank 0 holds the run directory (one run per directory)
                         # remote checkpoints (``remote``): store checked, newest fetched
    start.resumer        # the checkpoint to resume from, verified, settings checked
    setup_backend(backend, start.options)   # run directory and limits told, then setup()
    have = check_needs(backend, start.options, start.callbacks)  # abilities, by requester
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from baton.core.abilities import Ability, check_abilities
from baton.core.backend import Backend, RunLimits
from baton.core.callback import Callback
from baton.core.checkpoints.files import CheckpointError
from baton.core.checkpoints.remote import RemoteCheckpoints, prepare_remotes, with_upload
from baton.core.checkpoints.resuming import Resumer
from baton.core.checkpoints.rundir import RunDirLock
from baton.core.errors import UsageError
from baton.core.launch import Launch, LaunchError, restart_count
from baton.core.options import RunOptions
from baton.core.patches import PatchDecision, select_patches

log = logging.getLogger("baton")


@dataclass
class Start:
    """What ``prepare`` decided: the final options and callbacks, the patch report,
    the run directory's lock (rank 0; ``None`` elsewhere) and the planned resume."""

    options: RunOptions
    callbacks: list[Callback]
    patch_report: list[PatchDecision]
    lock: RunDirLock | None
    resumer: Resumer


def prepare(
    backend: Backend,
    callbacks: Sequence[Callback],
    options: RunOptions,
    *,
    evaluating: bool = False,
) -> Start:
    """Every check before ``backend.setup``, in order: restart, the checkpoint named
    to resume from, the launch, patches and state keys, the lock, remote checkpoint
    stores (checked; the newest checkpoint fetched for ``resume="auto"``), the resume
    plan."""
    remote = bool(options.checkpoint_upload) or any(
        isinstance(cb, RemoteCheckpoints) for cb in callbacks
    )
    options = after_restart(options, remote=remote)
    resumer = Resumer(backend, options, evaluating=evaluating)
    resumer.check_request()
    launch = launch_from_env()
    merged, report = with_patches(backend, with_upload(callbacks, options), options.patches)
    lock = lock_run_dir(options.run_dir) if launch.rank == 0 else None
    try:
        prepare_remotes(merged, options, rank_zero=launch.rank == 0)
        resumer.plan(rank_zero=launch.rank == 0)
    except BaseException as error:
        if lock is not None:  # leave the run directory as it was
            lock.release(remove_if_unused=True, remove_created=isinstance(error, UsageError))
        raise
    return Start(options, merged, report, lock, resumer)


def after_restart(options: RunOptions, *, remote: bool = False) -> RunOptions:
    """A job the engine restarted (torchrun elastic, SLURM requeue) resumes from its
    newest checkpoint; one whose run directory is gone has nothing to resume from,
    unless its checkpoints are kept remotely as well (``remote``)."""
    restarts = restart_count()
    if not restarts:
        return options
    if not options.run_dir.exists() and not remote:
        raise CheckpointError(
            f"this is restart {restarts} of the job, but its run directory {options.run_dir} "
            "is gone: nothing to resume. Restore it, or submit a new job to start fresh"
        )
    if options.resumes:
        return options
    log.warning("restart %d of this job: resuming from its newest checkpoint", restarts)
    return options.replace(resume="auto")


def launch_from_env() -> Launch:
    """Rank and world size as the launcher set them."""
    try:
        return Launch.from_env()
    except LaunchError as error:
        raise UsageError(f"{error}; fix the launch environment variables") from None


def with_patches(
    backend: Backend, callbacks: Sequence[Callback], selection: str | None
) -> tuple[list[Callback], list[PatchDecision]]:
    """The backend's selected patches first, then the user's callbacks (a patch given
    by hand is not added twice); every stateful callback's ``state_key`` is unique."""
    try:
        patches, report = select_patches(backend, selection)
    except ValueError as error:
        raise UsageError(str(error)) from None
    user = [cb for cb in callbacks if not any(type(cb) is type(p) for p in patches)]
    merged: list[Callback] = [*patches, *user]
    keys = [cb.state_key for cb in merged if cb.state_key is not None]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise UsageError(
            f"callbacks share state_key {duplicates}: give each stateful callback a unique "
            "state_key so checkpoints can tell their states apart"
        )
    return merged, report


def lock_run_dir(run_dir: Path) -> RunDirLock:
    """Take the run directory's lock (creating the directory), or say how to fix it."""
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except OSError as error:
        raise UsageError(
            f"cannot create or lock the run directory {run_dir} "
            f"({error.strerror or error}); choose a writable --run-dir"
        ) from None
    return lock


def check_needs(
    backend: Backend, options: RunOptions, callbacks: Sequence[Callback]
) -> frozenset[Ability]:
    """The one place optional backend abilities are checked (after ``backend.setup``):
    what the options and each callback's ``requires`` need must be there before the
    first step. Returns the backend's abilities."""
    needs: dict[str, set[Ability]] = {}
    if options.eval_every:
        needs[f"eval_every={options.eval_every}"] = {"evaluate"}
    if backend.world_size > 1:
        needs[f"a run on {backend.world_size} ranks"] = {"multi_rank"}
    for cb in callbacks:
        wanted = cb.requires()
        if wanted:
            needs.setdefault(repr(cb), set()).update(wanted)
    have = check_abilities(backend.name, backend.abilities(), needs)
    if options.async_save and "async_save" not in have:
        log.info("backend %s saves synchronously (no async_save ability)", backend.name)
    return have


def setup_backend(backend: Backend, options: RunOptions) -> None:
    """``backend.setup()``, after telling a backend that uses them the run directory
    (``use_run_dir``) and the driver's limits (``use_run_limits``)."""
    backend.use_run_dir(options.run_dir)
    backend.use_run_limits(RunLimits(options.max_steps, options.max_tokens, options.max_time_s))
    backend.setup()
