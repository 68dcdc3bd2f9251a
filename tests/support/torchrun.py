"""Launch a test worker on two CPU ranks with torchrun (gloo), the way users launch baton."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 600) -> None:
    """Run ``script args`` under ``torchrun --standalone`` (a free rendezvous port), one
    thread per rank; fail with the tail of its output when it does not exit 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc), str(script), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
