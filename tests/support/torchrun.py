"""Launch test workers with torchrun (gloo) the way users launch baton: one node with
several ranks, or several "nodes" on this host (one torchrun agent each, c10d rendezvous
on 127.0.0.1)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from support.processes import free_port, run_job, run_together

__all__ = ["free_port", "torchrun", "torchrun_nodes"]

_ENV = {
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "COLUMNS": "200",
    "PYTHONFAULTHANDLER": "1",  # a rank killed by a signal prints every thread's stack
}
_NOISE = ("FutureWarning: The pynvml package", "import pynvml")


def failure_report(stdout: str, stderr: str) -> str:
    """What a failed job printed, the ranks' own lines first: the agent's
    ``ChildFailedError`` traceback (which only says which rank died) is cut to its
    summary, and the deprecation notes every rank prints on import are left out."""
    agent = stderr.find('Traceback (most recent call last):\n  File "<frozen runpy>"')
    ranks, summary = (stderr, "") if agent < 0 else (stderr[:agent], stderr[agent:])
    summary = summary[summary.find("Failures:") :] if "Failures:" in summary else summary
    lines = [line for line in ranks.splitlines() if not any(n in line for n in _NOISE)]
    return stdout[-2000:] + "\n".join(lines)[-8000:] + "\n" + summary[-1500:]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 600) -> None:
    """Run ``script args`` under ``torchrun --standalone`` (a free rendezvous port), one
    thread per rank; fail with the tail of its output when it does not exit 0."""
    env = {**os.environ, **_ENV}
    done = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc), str(script), *args],
        env, timeout,
    )  # fmt: skip
    assert done.returncode == 0, failure_report(done.stdout, done.stderr)


def torchrun_nodes(
    script: Path, *args: str, nnodes: int = 2, nproc: int = 1, timeout: float = 600
) -> None:
    """Run ``script args`` as ``nnodes`` torchrun agents on this host (``--nnodes N
    --node-rank I``, c10d rendezvous on 127.0.0.1), ``nproc`` ranks each, as a
    multi-node job is launched; fail with each agent's output tail unless all exit 0."""
    env = {**os.environ, **_ENV}
    endpoint, job = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]

    def command(node: int) -> list[str]:
        return [
            *(sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes)),
            *("--node-rank", str(node), "--nproc-per-node", str(nproc)),
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job),
            *(str(script), *args),
        ]

    run_together([command(node) for node in range(nnodes)], [env] * nnodes, timeout)
