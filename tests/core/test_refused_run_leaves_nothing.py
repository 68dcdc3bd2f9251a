"""A run refused before it trains (a ``UsageError`` from a callback's ``on_setup``: a
Freeze glob that matches nothing) in a run directory it created leaves no directory
behind: no lock file, no patch report, no data cache. A directory that was there before
keeps what it held, and a run that fails for another reason keeps what it wrote."""

from __future__ import annotations

import pytest

from baton.core import Callback, Driver
from baton.core.errors import UsageError
from support.scalar_backend import ScalarBackend


class RefusesAtSetup(Callback):
    """Writes a file in the run directory (as a backend's data cache is), then raises."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def on_setup(self, driver: Driver) -> None:
        (driver.options.run_dir / "data").mkdir(exist_ok=True)
        (driver.options.run_dir / "data" / "cache.npy").write_bytes(b"built by setup")
        raise self.error


def test_a_refused_run_removes_the_directory_it_created(tmp_path):
    run_dir = tmp_path / "run"
    driver = Driver(
        ScalarBackend(), [RefusesAtSetup(UsageError("bad glob"))], run_dir=run_dir, max_steps=2
    )
    with pytest.raises(UsageError, match="bad glob"):
        driver.fit()
    assert not run_dir.exists()


def test_an_existing_directory_and_a_crash_keep_what_they_hold(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    driver = Driver(
        ScalarBackend(), [RefusesAtSetup(UsageError("bad glob"))], run_dir=existing, max_steps=2
    )
    with pytest.raises(UsageError):
        driver.fit()
    assert (existing / "notes.txt").read_text() == "mine"
    assert (existing / "data" / "cache.npy").is_file()

    crashed = tmp_path / "crashed"
    driver = Driver(
        ScalarBackend(), [RefusesAtSetup(RuntimeError("bug"))], run_dir=crashed, max_steps=2
    )
    with pytest.raises(RuntimeError):
        driver.fit()
    assert (crashed / "data" / "cache.npy").is_file()  # kept to look into
    assert (crashed / ".baton.lock").is_file()  # the lock file, no longer held
