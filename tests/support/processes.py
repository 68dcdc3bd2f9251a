"""Start the processes of one job on this host and collect them: ranks launched with
``BATON_*`` settings (a localhost coordinator), as a SLURM or hand-made launch does."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


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


def _kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` and all its descendants (a launcher's workers, which torchrun
    starts in sessions of their own), children first."""
    import psutil

    try:
        family = [*psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.kill()
    proc.wait()


def run_job(
    command: Sequence[str], env: Mapping[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run one launcher (torchrun, a rank) and return what it printed. On timeout it is
    killed with all its descendants, so a hung job's workers do not outlive the test,
    and ``TimeoutExpired`` carries the output so far."""
    proc = subprocess.Popen(
        list(command), env=dict(env), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(command), timeout, out, err) from None
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


def run_together(
    commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout: float = 600
) -> list[str]:
    """Run the commands at once (one per rank), wait for all, and return their outputs;
    fail with the tail of each output whose process did not exit 0. One still running
    at the end is killed with its descendants."""
    procs = [
        subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for cmd, env in zip(commands, envs, strict=True)
    ]
    outputs: list[str] = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc)
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, text[-6000:]
    return outputs
