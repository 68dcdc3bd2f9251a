"""Start the processes of one job on this host and collect them: ranks launched with
``BATON_*`` settings (a localhost coordinator), as a SLURM or hand-made launch does."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def baton_rank_envs(
    world_size: int, extra: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """One environment per rank: ``BATON_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``PORT`` on
    127.0.0.1 (a free port), one CPU thread, JAX on the CPU, plus ``extra``."""
    port = str(free_port())
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1", **(extra or {})}
    return [
        {**base, "BATON_RANK": str(rank), "BATON_WORLD_SIZE": str(world_size),
         "BATON_MASTER_ADDR": "127.0.0.1", "BATON_MASTER_PORT": port}
        for rank in range(world_size)
    ]  # fmt: skip


def run_together(
    commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout: float = 600
) -> list[str]:
    """Run the commands at once (one per rank), wait for all, and return their outputs;
    fail with the tail of each output whose process did not exit 0."""
    procs = [
        subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for cmd, env in zip(commands, envs, strict=True)
    ]
    outputs: list[str] = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text[-6000:]
    return outputs
