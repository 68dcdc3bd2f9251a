"""A run's checkpoints in object storage (any fsspec URL; ``s3://`` with s3fs).

Layout under the URL, the same names as the local ``checkpoints/`` directory::

    s3://bucket/prefix/
        step_000100/backend/...   the backend's files, uploaded first, each verified
        step_000100/baton.json    uploaded last: a checkpoint without it is unfinished
        latest                    text: the name of the newest verified checkpoint

Example::

    store = ObjectStore.open("s3://bucket/run")   # UsageError: no fsspec/s3fs, bad URL
    store.check()                                  # UsageError: unreachable, no access
    store.upload(Path("runs/x/checkpoints/step_000100"), verify="full")
    store.set_latest("step_000100")
    store.download("step_000100", Path("runs/x/checkpoints"), verify="full")

``fsspec`` and the protocol's implementation are imported when a store is opened, so
nothing else needs them installed. S3 settings come from the usual places
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``
for an S3-compatible server) or ``storage_options`` (``endpoint_url=...``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, cast

import xxhash

import baton.core.checkpoints.files as ckpt
from baton.core.errors import UsageError

log = logging.getLogger("baton")

_CHUNK = 1 << 22
#: how long a connection attempt may take before the store is called unreachable
CONNECT_TIMEOUT_S = 10


class UploadError(RuntimeError):
    """An uploaded object differs from the local file (size or checksum)."""


class ObjectStore:
    """One run's checkpoint area in object storage.

    Args:
        fs: the fsspec filesystem.
        root: the path under it (``bucket/prefix``), no protocol.
        url: the URL as given, for messages.
    """

    def __init__(self, fs: Any, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    @classmethod
    def open(cls, url: str, storage_options: dict[str, Any] | None = None) -> ObjectStore:
        """The store at ``url``; a ``UsageError`` naming the fix when fsspec or the
        protocol's package is missing or the URL is malformed."""
        try:
            fsspec_core: Any = importlib.import_module("fsspec.core")  # untyped package
        except ImportError:
            raise UsageError(
                f"checkpoint upload to {url}: fsspec is not installed; install "
                "baton-callbacks[s3] (fsspec and s3fs)"
            ) from None
        protocol, _, path = url.partition("://")
        if not path or not path.strip("/"):
            raise UsageError(
                f"checkpoint upload URL {url!r} names no bucket: give it as "
                "s3://bucket/prefix (a prefix per run)"
            )
        options = dict(storage_options or {})
        # a filesystem of its own: fsspec's shared instances keep the endpoint and
        # credentials of the environment they were first made in
        options.setdefault("skip_instance_cache", True)
        if protocol in ("s3", "s3a"):
            options.setdefault(
                "config_kwargs",
                # botocore's attempts on top of s3fs's own retries (5 per call)
                {
                    "connect_timeout": CONNECT_TIMEOUT_S,
                    "read_timeout": 60,
                    "retries": {"max_attempts": 2},
                },
            )
        try:
            fs, root = fsspec_core.url_to_fs(url, **options)
        except ImportError as error:
            raise UsageError(
                f"checkpoint upload to {url}: the {protocol!r} protocol needs a package that "
                f"is not installed ({error}); for s3:// install baton-callbacks[s3]"
            ) from None
        except ValueError as error:
            raise UsageError(f"checkpoint upload URL {url!r}: {error}") from None
        return cls(fs, cast(str, root), url)

    # -- paths ---------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def check(self) -> None:
        """List the store once: a ``UsageError`` saying what to fix when the endpoint
        is unreachable, the credentials are missing or wrong, or the bucket is absent."""
        bucket = self.root.split("/")[0]
        retries = getattr(self.fs, "retries", None)
        try:
            if retries is not None:
                self.fs.retries = 1  # an unreachable endpoint is reported at once
            self.fs.invalidate_cache()
            self.fs.ls(bucket, detail=False)
        except Exception as error:
            raise UsageError(
                f"cannot use checkpoint storage {self.url}: {type(error).__name__}: {error}. "
                "Check the bucket exists, the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and the endpoint (AWS_ENDPOINT_URL "
                "for an S3-compatible server)"
            ) from None
        finally:
            if retries is not None:
                self.fs.retries = retries

    def names(self) -> list[str]:
        """Checkpoint directories in the store (finished or not), oldest first."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return sorted(
            (n for n in found if ckpt.checkpoint_step(Path(n)) is not None),
            key=lambda n: ckpt.checkpoint_step(Path(n)) or 0,
        )

    def latest(self) -> str | None:
        """The name ``latest`` holds, or ``None``."""
        try:
            name = self.fs.cat_file(self._path(ckpt.LATEST)).decode().strip()
        except FileNotFoundError:
            return None
        return name if ckpt.checkpoint_step(Path(name)) is not None else None

    def resume_order(self) -> list[str]:
        """Names to try, like ``checkpointing.resume_order``: ``latest``'s first, then
        the others newest first."""
        order = list(reversed(self.names()))
        pointed = self.latest()
        if pointed in order:
            order.remove(pointed)
            order.insert(0, pointed)
        return order

    # -- writing -------------------------------------------------------------------
    def upload(self, local: Path, verify: str = "full", name: str | None = None) -> None:
        """Upload the complete checkpoint ``local`` (as ``name``, by default its own): its backend
        files (and a rollout run's ``rollouts/`` files), each checked
        against its ``baton.json`` entry (size; with ``verify="full"`` the xxh3-128 of
        the object read back), then ``baton.json`` itself, checked the same way.
        Raises ``UploadError`` on a mismatch (``latest`` is not moved)."""
        meta = json.loads((local / ckpt.META_FILE).read_text())
        name = name or local.name
        for key, folder in ckpt.LISTED_DIRS.items():
            files: dict[str, Any] = meta.get(key, {})
            for rel, entry in sorted(files.items()):
                target = self._path(name, folder, rel)
                self.put_file(local / folder / rel, target)
                self._verify(target, cast(dict[str, Any], entry), verify)
        meta_file = local / ckpt.META_FILE
        target = self._path(name, ckpt.META_FILE)
        self.put_file(meta_file, target)
        expected = {"size": meta_file.stat().st_size, ckpt.HASH: ckpt.file_digest(meta_file)}
        self._verify(target, expected, verify)

    def put_file(self, local: Path, remote: str) -> None:
        """Upload one file (a separate method so a test can slow it down)."""
        self.fs.put_file(str(local), remote)

    def _verify(self, remote: str, expected: dict[str, Any], verify: str) -> None:
        self.fs.invalidate_cache()
        size = int(self.fs.info(remote)["size"])
        if size != expected.get("size"):
            raise UploadError(f"{remote}: {size} bytes uploaded, expected {expected.get('size')}")
        if (
            verify == "full"
            and ckpt.HASH in expected
            and self._digest(remote) != expected[ckpt.HASH]
        ):
            raise UploadError(f"{remote}: the uploaded bytes do not match their {ckpt.HASH}")

    def _digest(self, remote: str) -> str:
        digest = xxhash.xxh3_128()
        with self.fs.open(remote, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def set_latest(self, name: str) -> None:
        """Point ``latest`` at ``name`` (one small object written whole)."""
        self.fs.pipe_file(self._path(ckpt.LATEST), f"{name}\n".encode())

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name``: its ``baton.json`` first, so a delete cut short
        leaves an unfinished checkpoint, never one that looks complete."""
        meta = self._path(name, ckpt.META_FILE)
        if self.fs.exists(meta):
            self.fs.rm_file(meta)
        if self.fs.exists(self._path(name)):
            self.fs.rm(self._path(name), recursive=True)
        self.fs.invalidate_cache()

    # -- reading -------------------------------------------------------------------
    def meta_bytes(self, name: str) -> bytes | None:
        """The bytes of checkpoint ``name``'s ``baton.json`` (``None``: unfinished)."""
        try:
            return self.fs.cat_file(self._path(name, ckpt.META_FILE))
        except FileNotFoundError:
            return None

    def download(self, name: str, checkpoint_dir: Path, verify: str = "full") -> Path:
        """Download checkpoint ``name`` into ``checkpoint_dir`` (under a temporary name,
        verified like a local resume by ``checkpointing.read_meta``, then renamed and
        made ``latest``). Raises ``CheckpointError`` when it is unfinished or differs
        from its ``baton.json``; nothing is left behind then."""
        tmp = checkpoint_dir / f"{ckpt.TMP_PREFIX}download-{name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / ckpt.BACKEND_DIR).mkdir(parents=True)
        try:
            try:
                raw = self.fs.cat_file(self._path(name, ckpt.META_FILE))
            except FileNotFoundError:
                raise ckpt.CheckpointError(
                    f"{self.url}/{name}: no {ckpt.META_FILE}; its upload did not finish"
                ) from None
            (tmp / ckpt.META_FILE).write_bytes(raw)
            meta = json.loads(raw)
            for key, folder in ckpt.LISTED_DIRS.items():
                for rel in sorted(meta.get(key, {})):
                    local = tmp / folder / rel
                    local.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        self.fs.get_file(self._path(name, folder, rel), str(local))
                    except FileNotFoundError:
                        raise ckpt.CheckpointError(
                            f"{self.url}/{name}: {folder} file {rel} is missing"
                        ) from None
            ckpt.read_meta(tmp, verify)
            ckpt.fsync_tree(tmp)
            final = checkpoint_dir / name
            if final.exists():
                ckpt.remove_checkpoint(final)
            os.replace(tmp, final)
            ckpt.fsync_path(checkpoint_dir)
            ckpt.update_latest(checkpoint_dir, final)
            return final
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
