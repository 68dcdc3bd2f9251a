"""A default log sink whose package is missing is left out, with one line saying how to
add it, and the run trains; a sink asked for by name still refuses in one line.

The package is really missing: each run is ``baton`` started by a wrapper script that
makes ``import crc32c`` fail (``sys.modules["crc32c"] = None``, what Python does for a
module that cannot be imported) before anything of baton is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
WRAPPER = """\
import sys

for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` now raises ImportError, as if not installed

from baton.core.cli.command import main

sys.exit(main(sys.argv[2:]))
"""
#: quickstart's GPT, small enough for a few seconds on a CPU
TINY = ["--max-steps", "2", "--layers", "1", "--d-model", "32", "--batch-size", "2",
        "--seq-len", "32", "--log-every", "1", "--eval-every", "0", "--no-progress"]  # fmt: skip


def run_without(missing: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    wrapper = tmp_path / "without_package.py"
    wrapper.write_text(WRAPPER)
    return subprocess.run(
        [sys.executable, str(wrapper), missing, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=os.environ | ENV,
    )


def test_a_default_sink_without_its_package_is_left_out_and_the_run_trains(tmp_path):
    run_dir = tmp_path / "run"
    result = run_without(
        "crc32c", tmp_path, "run", "recipes/quickstart.py", *TINY, "--run-dir", str(run_dir)
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    said = [line for line in output.splitlines() if "left out" in line]
    assert len(said) == 1, output[-3000:]
    assert "'tensorboard'" in said[0] and "crc32c" in said[0]
    assert "pip install 'baton-callbacks[tensorboard]'" in said[0]
    assert (run_dir / "logs" / "metrics.jsonl").is_file()  # the other sinks wrote
    assert not (run_dir / "logs" / "tensorboard").exists()


def test_a_sink_asked_for_by_name_without_its_package_refuses(tmp_path):
    run_dir = tmp_path / "run"
    result = run_without(
        "crc32c", tmp_path, "run", "recipes/quickstart.py", *TINY, "--run-dir", str(run_dir),
        "--callback", "logger:sinks=[jsonl,tensorboard]",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("baton:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "the 'tensorboard' log sink needs the crc32c package" in lines[0]
    assert not run_dir.exists()  # refused before anything was written
