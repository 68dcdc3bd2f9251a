"""Where this process stands in a job: rank, local rank, world size and node, read from
the engine that started it (torchrun, SLURM's ``srun``) or from explicit settings.

baton has no launcher of its own; every backend reads its place the same way::

    from baton.core.launch import Launch

    launch = Launch.from_env()
    launch.rank, launch.world_size, launch.local_rank, launch.node_rank, launch.source
    # torchrun --nnodes 2 --nproc-per-node 8 ... -> source "torchrun"
    # srun --ntasks 16 ...                      -> source "slurm"
    # BATON_RANK=0 BATON_WORLD_SIZE=2 BATON_MASTER_ADDR=10.0.0.1 ... -> "explicit"
    # python train.py                           -> "single" (rank 0 of 1)

Precedence: torchrun's variables (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, which torchrun
sets also when it runs inside a SLURM allocation), then SLURM's task variables
(``SLURM_PROCID``/``SLURM_NTASKS``... of an ``srun`` step with more than one task), then
``BATON_*`` settings, then the processes Lightning Fabric starts itself on one node
(``FabricConfig(devices=2)`` without torchrun: it re-runs the command with
``LOCAL_RANK``, ``WORLD_SIZE`` and ``NODE_RANK`` but no ``RANK``), else a single process.
This module imports neither torch nor jax.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: the port SLURM jobs rendezvous on when none is set: derived from the job id so that
#: two jobs sharing a first node do not collide
_SLURM_PORT_BASE = 29500
_SLURM_PORT_SPAN = 1000


class LaunchError(ValueError):
    """The launch environment is inconsistent; the message names the variables."""


@dataclass(frozen=True)
class Launch:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    #: rendezvous host and port of rank 0 (``None`` for a single process)
    master_addr: str | None = None
    master_port: int | None = None
    #: ``torchrun``, ``slurm``, ``explicit``, ``lightning`` or ``single``
    source: str = "single"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        """Read the launch from ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env
        if "RANK" in env and "WORLD_SIZE" in env:
            return _from_torchrun(env)
        if _int(env, "SLURM_NTASKS", 1) > 1 and "SLURM_PROCID" in env:
            return _from_slurm(env)
        if "BATON_WORLD_SIZE" in env:
            return _from_explicit(env)
        if {"LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"} <= env.keys():
            return _from_lightning(env)
        return cls()

    def torch_env(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` rendezvous reads (what torchrun
        would have set), for processes started by SLURM or by hand."""
        if self.master_addr is None or self.master_port is None:
            raise LaunchError(
                f"{self.source} launch of {self.world_size} processes names no rendezvous "
                "address: set MASTER_ADDR and MASTER_PORT (or BATON_MASTER_ADDR/PORT)"
            )
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    value = env.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{key}={value!r} is not an integer") from None


def _check(launch: Launch) -> Launch:
    if not 0 <= launch.rank < launch.world_size:
        raise LaunchError(
            f"{launch.source} launch: rank {launch.rank} is outside world size {launch.world_size}"
        )
    if not 0 <= launch.local_rank < max(1, launch.local_world_size):
        raise LaunchError(
            f"{launch.source} launch: local rank {launch.local_rank} is outside local world "
            f"size {launch.local_world_size}"
        )
    return launch


def _from_torchrun(env: Mapping[str, str]) -> Launch:
    world = _int(env, "WORLD_SIZE", 1)
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    return _check(
        Launch(
            rank=_int(env, "RANK", 0),
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=local_world,
            node_rank=_int(env, "GROUP_RANK", _int(env, "NODE_RANK", 0)),
            num_nodes=max(1, world // max(1, local_world)),
            master_addr=env.get("MASTER_ADDR"),
            master_port=_int(env, "MASTER_PORT", 0) or None,
            source="torchrun",
        )
    )


def _from_slurm(env: Mapping[str, str]) -> Launch:
    world = _int(env, "SLURM_NTASKS", 1)
    num_nodes = _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    addr = env.get("MASTER_ADDR") or first_host(nodelist) or None
    port = _int(env, "MASTER_PORT", 0) or (
        _SLURM_PORT_BASE + _int(env, "SLURM_JOB_ID", 0) % _SLURM_PORT_SPAN
    )
    local_world = _int(env, "SLURM_NTASKS_PER_NODE", 0) or max(1, world // max(1, num_nodes))
    return _check(
        Launch(
            rank=_int(env, "SLURM_PROCID", 0),
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world_size=local_world,
            node_rank=_int(env, "SLURM_NODEID", 0),
            num_nodes=num_nodes,
            master_addr=addr,
            master_port=port,
            source="slurm",
        )
    )


def _from_lightning(env: Mapping[str, str]) -> Launch:
    """A process Lightning's subprocess launcher started (``devices=N``, no torchrun)."""
    if _int(env, "NODE_RANK", 0) != 0:
        raise LaunchError(
            "Lightning started this process on node "
            f"{env['NODE_RANK']}: for several nodes launch with torchrun or SLURM"
        )
    world = _int(env, "WORLD_SIZE", 1)
    return _check(
        Launch(
            rank=_int(env, "LOCAL_RANK", 0),
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=world,
            master_addr=env.get("MASTER_ADDR"),
            master_port=_int(env, "MASTER_PORT", 0) or None,
            source="lightning",
        )
    )


def _from_explicit(env: Mapping[str, str]) -> Launch:
    world = _int(env, "BATON_WORLD_SIZE", 1)
    local_world = _int(env, "BATON_LOCAL_WORLD_SIZE", world)
    return _check(
        Launch(
            rank=_int(env, "BATON_RANK", 0),
            world_size=world,
            local_rank=_int(env, "BATON_LOCAL_RANK", _int(env, "BATON_RANK", 0) % local_world),
            local_world_size=local_world,
            node_rank=_int(env, "BATON_NODE_RANK", 0),
            num_nodes=_int(env, "BATON_NUM_NODES", max(1, world // max(1, local_world))),
            master_addr=env.get("BATON_MASTER_ADDR"),
            master_port=_int(env, "BATON_MASTER_PORT", 0) or None,
            source="explicit",
        )
    )


#: seconds a rank waits for the others at the rendezvous (``BATON_RENDEZVOUS_TIMEOUT``)
DEFAULT_RENDEZVOUS_TIMEOUT_S = 600


def rendezvous_timeout_s() -> float:
    """How long a rank waits for the others to join (``BATON_RENDEZVOUS_TIMEOUT``)."""
    value = os.environ.get("BATON_RENDEZVOUS_TIMEOUT", "")
    try:
        return float(value) if value else DEFAULT_RENDEZVOUS_TIMEOUT_S
    except ValueError:
        raise LaunchError(
            f"BATON_RENDEZVOUS_TIMEOUT={value!r} is not a number of seconds"
        ) from None


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How often the engine restarted this job: torchrun's elastic restarts
    (``TORCHELASTIC_RESTART_COUNT``) or SLURM requeues (``SLURM_RESTART_COUNT``)."""
    env = os.environ if env is None else env
    return max(_int(env, "TORCHELASTIC_RESTART_COUNT", 0), _int(env, "SLURM_RESTART_COUNT", 0))


_RANGE = re.compile(r"^([^\[,]+)(?:\[([^\]]+)\])?")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[003-010,012],gpu7`` -> ``node003``."""
    match = _RANGE.match(nodelist.strip())
    if not match:
        return ""
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"
