"""A user who wants one piece installs only it: baton's core and callbacks without torch,
jax, TensorBoard or W&B work, and a sink whose package is missing says which extra to add."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_core_and_callbacks_alone(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    env = {**os.environ, "UV_COMPILE_BYTECODE": "0"}
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", "3.12", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "-q", "-p", python,
         str(ROOT / "packages" / "core"), str(ROOT / "packages" / "callbacks")],
        check=True, env=env, timeout=600,
    )  # fmt: skip
    code = (
        "import sys\n"
        "from baton.callbacks import CompositeLogger\n"
        "assert [s.name for s in CompositeLogger().sinks] == ['jsonl', 'console']\n"
        "try:\n"
        "    CompositeLogger(['jsonl', 'wandb'])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "heavy = [m for m in ('torch', 'jax', 'tensorboard', 'wandb') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pip install 'baton-callbacks[wandb]'" in done.stdout
