"""Bytecode is compiled once, where the environment is created, never on each `uv run`.

A project-level `compile-bytecode = true` makes uv recompile the whole environment
(~28k files) before every `uv run` (astral-sh/uv #12202); these machines also set
PYTHONDONTWRITEBYTECODE=1, so Python never caches bytecode itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_does_not_ask_uv_to_compile_on_every_run() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    assert "compile-bytecode" not in settings


def test_uv_run_compiles_nothing() -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    env = {k: v for k, v in os.environ.items() if k != "UV_COMPILE_BYTECODE"}
    done = subprocess.run(
        [uv, "run", "--frozen", "-v", "python", "-c", "print('ok')"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok" in done.stdout
    assert "Bytecode compiled" not in done.stderr, done.stderr[-2000:]


def test_ci_installs_with_bytecode() -> None:
    """CI creates its environment with `uv sync --compile-bytecode`: torch's modules are
    compiled there (a process that imports torch does not recompile it)."""
    if os.environ.get("CI") != "true":
        pytest.skip("only CI's environment is known to be synced by .ci/run")
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    cached = list((Path(spec.origin).parent / "__pycache__").glob("*.pyc"))
    assert cached, "torch has no bytecode: .ci/run must sync with --compile-bytecode"
