"""Checkpoints kept elsewhere too (object storage): the extension point the driver
calls before it plans a resume.

A callback that mirrors the run's checkpoints to a remote store (``CheckpointUpload``
in ``baton.callbacks``, for ``s3://`` URLs) implements ``RemoteCheckpoints``.
``startup.prepare`` calls ``prepare_remote`` on each such callback after the run
directory is locked and before the resume plan is made, so a run on a machine whose
run directory is empty resumes from the store as if the checkpoint had been local::

    class MyStore(Callback):
        def prepare_remote(self, options: RunOptions, *, rank_zero: bool) -> None:
            ...  # check the store (UsageError), fetch the newest checkpoint if needed

``RunOptions.checkpoint_upload`` (``--checkpoint-upload s3://bucket/prefix``) adds the
registered ``checkpoint_upload`` callback where the recipe has none: core imports
neither it nor fsspec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from baton.core.callback import Callback
from baton.core.errors import UsageError
from baton.core.options import RunOptions
from baton.core.registry import CALLBACKS, UnknownNameError

#: the registered callback ``checkpoint_upload=URL`` builds
UPLOAD_CALLBACK = "checkpoint_upload"


@runtime_checkable
class RemoteCheckpoints(Protocol):
    """A callback that keeps checkpoints in a remote store as well."""

    def prepare_remote(self, options: RunOptions, *, rank_zero: bool) -> None:
        """Before the resume plan: check the store is reachable (a ``UsageError``
        naming the fix otherwise) and, with ``options.resume == "auto"``, bring its
        newest complete checkpoint into ``options.run_dir / "checkpoints"`` where that
        holds nothing newer (verified against its ``baton.json``). It is called on
        every rank (``rank_zero`` says which is rank 0); the ranks' run directories may
        differ (a local disk per node), but each must then plan the same checkpoint
        first: ``Resumer.resume`` compares them before loading."""
        ...


def with_upload(callbacks: Sequence[Callback], options: RunOptions) -> list[Callback]:
    """``callbacks`` plus the ``checkpoint_upload`` callback for
    ``options.checkpoint_upload``, unless one is there already."""
    url = options.checkpoint_upload
    merged = list(callbacks)
    if not url or any(isinstance(cb, RemoteCheckpoints) for cb in merged):
        return merged
    try:
        factory = CALLBACKS.get(UPLOAD_CALLBACK)
    except (UnknownNameError, ImportError):
        raise UsageError(
            f"checkpoint_upload={url!r} needs the checkpoint_upload callback: "
            "install baton-callbacks[s3] (fsspec and s3fs)"
        ) from None
    merged.append(factory(url))
    return merged


def prepare_remotes(callbacks: Sequence[Callback], options: RunOptions, *, rank_zero: bool) -> None:
    """Call ``prepare_remote`` on every callback that keeps checkpoints remotely."""
    for cb in callbacks:
        if isinstance(cb, RemoteCheckpoints):
            cb.prepare_remote(options, rank_zero=rank_zero)
