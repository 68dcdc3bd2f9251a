"""Checkpoint integrity: checksums catch same-size corruption, every write is fsynced
in order, ``latest`` is preferred, and an async save is hashed off the training thread."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from baton.core import Abilities, Callback, CheckpointError, Driver
from baton.core.checkpoints import files as ckpt
from support.scalar_backend import ScalarBackend


class SaveEvery(Callback):
    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, driver, output):
        if driver.step % self.every == 0:
            driver.control.request_save("schedule", all_ranks=True)


def run(run_dir: Path, steps: int, resume: str = "none", **kwargs) -> Driver:
    driver = Driver(
        kwargs.pop("backend", None) or ScalarBackend(),
        [SaveEvery(3)],
        max_steps=steps,
        log_every=1,
        run_dir=run_dir,
        resume=resume,
        **kwargs,
    )
    driver.fit()
    return driver


def state_file(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / ckpt.checkpoint_name(step) / "backend" / "state.json"


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_manifest_records_size_and_checksum(tmp_path):
    run(tmp_path, 3)
    meta = ckpt.read_meta(tmp_path / "checkpoints" / "step_000003")
    state = state_file(tmp_path, 3)
    assert meta["files"]["state.json"] == {
        "size": state.stat().st_size,
        "xxh3_128": ckpt.file_digest(state),
    }


@pytest.mark.parametrize("damage", ["bit_flip", "zero_fill"])
def test_same_size_corruption_is_skipped_with_a_warning(tmp_path, caplog, damage):
    run(tmp_path, 6)
    newest = state_file(tmp_path, 6)
    size = newest.stat().st_size
    if damage == "bit_flip":
        flip_one_bit(newest)
    else:
        newest.write_bytes(b"\0" * size)
    assert newest.stat().st_size == size
    with caplog.at_level("WARNING", logger="baton"):
        driver = run(tmp_path, 8, resume="auto")
    assert driver.resumed_from.name == "step_000003"
    assert "does not match its xxh3_128 checksum (corrupted)" in caplog.text


def test_verify_size_skips_checksums(tmp_path):
    run(tmp_path, 6)
    flip_one_bit(state_file(tmp_path, 6))
    path = tmp_path / "checkpoints" / "step_000006"
    ckpt.read_meta(path, verify="size")  # sizes match: accepted without reading the bytes
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.read_meta(path, verify="full")
    with pytest.raises(ValueError, match="verify='fast' is not one of full, size"):
        Driver(ScalarBackend(), max_steps=1, verify="fast")


def test_resume_auto_prefers_a_valid_latest(tmp_path):
    run(tmp_path, 6)
    root = tmp_path / "checkpoints"
    ckpt.update_latest(root, root / "step_000003")  # e.g. a rollback pointed it back
    assert run(tmp_path, 7, resume="auto").resumed_from.name == "step_000003"


def test_only_the_checkpoint_resumed_from_is_read_in_full(tmp_path, caplog):
    run(tmp_path, 6)
    flip_one_bit(state_file(tmp_path, 3))  # an older one: not needed, so never read
    with caplog.at_level("WARNING", logger="baton"):
        assert run(tmp_path, 7, resume="auto").resumed_from.name == "step_000006"
    assert "skipping" not in caplog.text


def test_every_checkpoint_broken_stops_with_each_reason(tmp_path):
    run(tmp_path, 6)
    flip_one_bit(state_file(tmp_path, 6))
    state_file(tmp_path, 3).write_text("{}")
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(CheckpointError) as raised:
        run(tmp_path, 9, resume="auto")
    message = str(raised.value)
    assert "none can be loaded" in message and "--overwrite" in message
    assert "step_000006: backend file state.json does not match" in message
    assert "step_000003: backend file state.json has 2 bytes" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


def test_fsync_order_files_and_dirs_before_rename_parent_and_latest_after(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", f"{os.fspath(src)} -> {os.fspath(dst)}"))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    run(tmp_path, 3)
    root = (tmp_path / "checkpoints").resolve()
    tmp, final = root / ".tmp-step_000003", root / "step_000003"
    rename = events.index(("replace", f"{tmp} -> {final}".replace(str(root), str(root))))
    before = {path for kind, path in events[:rename] if kind == "fsync"}
    must_sync = {str(tmp), str(tmp / "backend"), str(tmp / "backend" / "state.json")}
    must_sync.add(str(tmp / "baton.json"))
    assert must_sync <= before, must_sync - before
    after = events[rename + 1 :]
    assert after[0] == ("fsync", str(root))  # the rename itself is durable
    swap = after.index(("replace", f"{root / '.tmp-latest'} -> {root / 'latest'}"))
    assert after[swap + 1] == ("fsync", str(root))  # and so is the latest swap


class AsyncScalar(ScalarBackend):
    """Writes its state on a thread: an asynchronous save the driver must poll. The
    write is finished by the end of the next step (as a real backend's staging is), so
    the driver sees it done then and not only at the end of a run of microsecond steps
    that can outpace the writer thread's start on a busy machine."""

    def abilities(self):
        return Abilities(evaluate=True, async_save=True)

    _writing: Future | None = None

    def train_step(self, step):
        if self._writing is not None:
            self._writing.result(timeout=10)
            self._writing = None
        return super().train_step(step)

    def save(self, directory, *, asynchronous=False):
        if not asynchronous:
            return super().save(directory)
        future: Future = Future()
        self._writing = future
        release = threading.Event()

        def write():
            release.wait(5)
            super(AsyncScalar, self).save(directory)
            future.set_result(None)

        threading.Thread(target=write).start()
        release.set()

        class Handle:
            def done(self):
                return future.done()

            def wait(self):
                future.result()

        return Handle()


def test_async_save_is_hashed_off_the_training_thread(tmp_path, monkeypatch):
    calls: list[tuple[str, int]] = []
    real_manifest = ckpt.manifest

    def manifest(directory, **kwargs):
        # hold the hashing until the loop has trained two more steps: only possible
        # when hashing does not run on the training thread
        start, deadline = driver.step, time.monotonic() + 10
        while driver.step < min(start + 2, 9) and time.monotonic() < deadline:
            time.sleep(0.005)
        calls.append((threading.current_thread().name, driver.step - start))
        return real_manifest(directory, **kwargs)

    monkeypatch.setattr(ckpt, "manifest", manifest)
    driver = Driver(AsyncScalar(), [SaveEvery(3)], max_steps=9, log_every=1, run_dir=tmp_path)
    driver.options = driver.options.replace(async_save=True)
    driver.fit()
    assert [p.name for p in driver.saved] == ["step_000003", "step_000006", "step_000009"]
    assert all(name.startswith("baton-checksum") for name, _ in calls), calls
    assert calls[0][1] >= 2, calls  # training went on while the first save was hashed
    for path in driver.saved:
        ckpt.read_meta(path)  # checksums match the files
