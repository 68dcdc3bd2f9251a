"""Helpers for the safety tests: run ``baton`` in this process and snapshot directories."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from baton.core.cli.command import main

RECIPE = Path(__file__).with_name("recipe_scalar.py")


def snapshot(directory: Path) -> dict[str, str] | None:
    """Every path below ``directory`` with its content hash (``None``: it does not exist);
    the run lock, which names its latest holder, is left out."""
    if not directory.exists():
        return None
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file() and not p.is_symlink()
        else ("link:" + str(p.readlink()) if p.is_symlink() else "dir")
        for p in sorted(directory.rglob("*"))
        if p.name != ".baton.lock"
    }


def baton(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``baton ARGS`` in this process: (exit status, its output: log lines and stderr)."""
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def run_recipe(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> tuple[int, str]:
    return baton(capsys, "run", str(RECIPE), "--run-dir", str(run_dir), *args)


@pytest.fixture(autouse=True)
def plain_baton_logger(monkeypatch):
    """Each test starts and ends with the ``baton`` logger as Python leaves it (the
    command line points it at the console, which would hide records from ``caplog``)."""
    import logging

    logger = logging.getLogger("baton")
    monkeypatch.setenv("COLUMNS", "400")  # log lines unwrapped, so tests can read them

    def reset() -> None:
        logger.handlers[:] = []
        logger.setLevel(logging.NOTSET)
        logger.propagate = True

    reset()
    yield
    reset()
