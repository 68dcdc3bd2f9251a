"""The scalar recipe with its checkpoints uploaded to object storage, and a way to hold
one upload part-way (to kill the process there): ``--pause-at-step 4 --marker PATH``
makes the upload of ``step_000004`` write PATH after its first object and then wait
for ever."""

from __future__ import annotations

import time
from pathlib import Path

from baton.callbacks import Checkpoint, CheckpointUpload
from baton.callbacks.object_store import ObjectStore
from baton.core import Driver
from support.scalar_backend import ScalarBackend


class HeldStore(ObjectStore):
    """Holds the upload of one checkpoint after its first object is written."""

    pause_name = ""
    marker = Path()

    def put_file(self, local: Path, remote: str) -> None:
        super().put_file(local, remote)
        if self.pause_name and f"/{self.pause_name}/" in remote:
            self.marker.write_text(remote)
            while True:  # until the test kills the process
                time.sleep(1)


class HeldUpload(CheckpointUpload):
    def __init__(self, url: str, pause_name: str, marker: str) -> None:
        super().__init__(url)
        self.pause_name, self.marker = pause_name, Path(marker)

    def open_store(self) -> ObjectStore:
        plain = super().open_store()
        store = HeldStore(plain.fs, plain.root, plain.url)
        store.pause_name, store.marker = self.pause_name, self.marker
        return store


def recipe(
    run_dir: str,
    url: str,
    max_steps: int = 6,
    save_every: int = 2,
    keep_last: int = 2,
    pause_at_step: int = 0,
    marker: str = "",
) -> Driver:
    """Gradient descent on a scalar, checkpoints uploaded to ``url``."""
    name = f"step_{pause_at_step:06d}" if pause_at_step else ""
    return Driver(
        ScalarBackend(lr=0.1),
        [Checkpoint(every_n_steps=save_every, keep_last=keep_last), HeldUpload(url, name, marker)],
        max_steps=max_steps,
        log_every=1,
        run_dir=run_dir,
    )
