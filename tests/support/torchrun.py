"""Launch a test worker on CPU ranks with torchrun (gloo), the way users launch baton:
on one "node" (``torchrun``) or as several torchrun agents that meet through a c10d
rendezvous on 127.0.0.1, one per "node" (``torchrun_nodes``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 600) -> None:
    """Run ``script args`` under ``torchrun --standalone`` (a free rendezvous port), one
    thread per rank; fail with the tail of its output when it does not exit 0."""
    env = {**os.environ, **_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc), str(script), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_nodes(
    script: Path, *args: str, nnodes: int = 2, nproc: int = 1, timeout: float = 600
) -> None:
    """Run ``script args`` as ``nnodes`` torchrun agents on this host (``--nnodes N``,
    ``--node-rank i``, c10d rendezvous on 127.0.0.1), ``nproc`` ranks each: the launch a
    multi-node job makes, with the nodes on one machine. Fails with each agent's tail."""
    env = {**os.environ, **_ENV}
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    for node in range(nnodes):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                   "--nproc-per-node", str(nproc), "--node-rank", str(node),
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                   "--rdzv-id", "baton-test", str(script), *args]  # fmt: skip
        agents.append(
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
        )
    outputs = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=timeout)[0])
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    failed = [i for i, agent in enumerate(agents) if agent.returncode != 0]
    assert not failed, "\n".join(f"node {i}:\n{outputs[i][-4000:]}" for i in failed)
