"""The torch.distributed plumbing every torch backend shares: process group from the
launch, rank and world size, barrier, flag all-reduce, and the one-transfer ``fetch``.

A backend owns one ``TorchDistributed`` runtime (as the Fabric backends own a
``FabricRuntime``) and composes ``UsesTorchDistributed``, which hands its ranks,
barrier, flags and host transfers over to it::

    class MyBackend(UsesTorchDistributed, BackendBase):
        def __init__(self) -> None:
            self.runtime = TorchDistributed()

        def setup(self) -> None:
            self.runtime.init_process_group()   # torchrun, SLURM, BATON_* or one process
            model = build(device=self.runtime.device)
            ...

``init_process_group`` reads the launch the same way for every backend
(``baton.core.launch.Launch``); a process started by SLURM without torchrun (or with
``BATON_*`` settings) joins rank 0's TCP store directly, within
``BATON_RENDEZVOUS_TIMEOUT`` seconds, or fails naming the endpoint. One that nobody launched gets a one-rank group on a
file store (no port to collide on). The group is destroyed in ``teardown_process_group``
only if this runtime created it.
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from baton.core.launch import Launch, LaunchError, rendezvous_timeout_s


def fetch(
    values: Mapping[str, Any], prepare: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> dict[str, float]:
    """Every tensor to the host in one transfer (stacked); plain numbers pass through.

    ``prepare`` turns a tensor into a 0-d tensor on one device first (a DTensor's
    ``full_tensor()``, a reduction over a mesh).
    """
    out: dict[str, float] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            if prepare is not None:
                value = prepare(value)
            tensors[key] = value.detach().float().reshape(())
        else:
            out[key] = float(value)
    if tensors:
        host = torch.stack(list(tensors.values())).cpu().tolist()
        out.update(zip(tensors, host, strict=True))
    return out


def all_reduce_flags(flags: list[bool], device: torch.device | str = "cpu") -> list[bool]:
    """OR of each flag over every rank (one small all-reduce); local with one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(flags)
    tensor = torch.tensor([float(f) for f in flags], device=device)
    dist.all_reduce(tensor)
    return [bool(v > 0) for v in tensor.tolist()]


def barrier() -> None:
    """Wait for every rank (no-op without a group or with one rank)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


#: set by torchrun's agent when its workers share the agent's TCP store
AGENT_STORE_FLAG = "TORCHELASTIC_USE_AGENT_STORE"
#: the key in the agent's store under which rank 0 publishes its attempt's store (one
#: key per group a process creates: ``attempt_store_key(n)``)
ATTEMPT_STORE_KEY = "baton/attempt_store"
#: how many groups this process has joined through ``attempt_store`` (every rank creates
#: its groups in the same order, so the n-th group of each rank is the same group)
_groups_joined = itertools.count()
#: how long a rank tries one published endpoint before reading the key again
ATTEMPT_CONNECT_S = 3.0


def attempt_store(
    launch: Launch, env: Mapping[str, str], wait: timedelta, group: int | None = None
) -> dist.Store:
    """A TCP store of this attempt's own, for a job under torchrun's shared agent store.

    torchrun's agent keeps one TCP store for the whole job and its workers' ``env://``
    groups write their addresses into it without a per-attempt namespace; after an
    elastic restart a fast rank can read a dead rank's address from the previous attempt
    and the new group fails to connect or hangs. (The restart count is no namespace:
    each node's agent counts its own restarts.) So rank 0 starts a fresh store on a free
    port, tagged with a random token, and publishes ``host:port:token`` in the agent's
    store; every other rank reads it, connects, and checks the token, reading again
    while what it found is a previous attempt's (its store is gone with its rank 0, or
    the port now serves another token). A process that creates several groups in turn
    (one run after another) publishes each under a key of its own (``group``: which of
    this process's groups, counted by default).
    """
    host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    agent = dist.TCPStore(host, port, is_master=False, timeout=wait)
    key = f"{ATTEMPT_STORE_KEY}/{next(_groups_joined) if group is None else group}"
    if launch.rank == 0:
        token = uuid.uuid4().hex
        store = dist.TCPStore(
            host, 0, launch.world_size, is_master=True, timeout=wait, wait_for_workers=False
        )
        store.set("baton/token", token)
        agent.set(key, f"{host}:{store.port}:{token}")
        return store
    deadline = time.monotonic() + wait.total_seconds()
    while True:
        published = agent.get(key).decode()  # waits until rank 0 wrote it
        store_host, store_port, token = published.rsplit(":", 2)
        if _listening(store_host, int(store_port)):  # else a previous attempt's: gone
            try:
                store = dist.TCPStore(
                    store_host,
                    int(store_port),
                    is_master=False,
                    timeout=timedelta(seconds=ATTEMPT_CONNECT_S),
                )
                if store.get("baton/token").decode() == token:
                    store.set_timeout(wait)
                    return store
            except (RuntimeError, ValueError):  # closed while connecting
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no store of this attempt at {published} (torchrun restart)")
        time.sleep(0.2)


def _listening(host: str, port: int) -> bool:
    """Whether something accepts connections at ``host:port`` (a plain socket probe:
    the TCP store's own client would log a C++ stack trace for every refusal)."""
    try:
        with socket.create_connection((host, port), timeout=ATTEMPT_CONNECT_S):
            return True
    except OSError:
        return False


class TorchDistributed:
    """One run's torch.distributed runtime: the process group it joins or creates, the
    device its collectives and flags live on, and the rank, world size, ``barrier``,
    ``all_reduce_flags`` and ``fetch`` over them.

    ``broadcast`` sends rank 0's object to every rank.

    ``device`` is the CPU until ``init_process_group`` picks ``cuda:LOCAL_RANK`` where
    CUDA is available; a backend whose framework chooses the device (TorchTitan's
    trainer) sets it.
    """

    def __init__(self) -> None:
        #: the device collectives and flags live on
        self.device = torch.device("cpu")
        self._owns_process_group = False
        self._store_file: str | None = None

    @property
    def rank(self) -> int:
        """The global rank; before the group exists, the launcher's."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return Launch.from_env().rank

    @property
    def world_size(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return Launch.from_env().world_size

    @property
    def local_rank(self) -> int:
        return Launch.from_env().local_rank

    @property
    def device_type(self) -> str:
        return self.device.type

    def init_process_group(
        self, backend: str = "auto", *, timeout: timedelta | None = None
    ) -> Launch:
        """Join (or create) the default process group as the launch says; pick the
        device (``cuda:LOCAL_RANK`` when CUDA is available). Returns the launch."""
        launch = Launch.from_env()
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(launch.local_rank)
            self.device = torch.device("cuda", launch.local_rank)
        if dist.is_initialized():
            return launch
        if backend == "auto":
            backend = "nccl" if cuda else "gloo"
        if launch.distributed:
            # torchrun's variables (env://) or, for SLURM and BATON_* launches, rank 0's
            # address given explicitly: nothing is written into the environment
            env = launch.torch_env() if launch.source != "torchrun" else dict(os.environ)
            endpoint = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
            init = "env://" if launch.source == "torchrun" else f"tcp://{endpoint}"
            wait = timeout or timedelta(seconds=rendezvous_timeout_s())
            try:
                if launch.source == "torchrun" and env.get(AGENT_STORE_FLAG) == "True":
                    store = attempt_store(launch, env, wait)
                    group_source: dict[str, Any] = {"store": store}
                else:
                    group_source = {"init_method": init}
                dist.init_process_group(
                    backend,
                    **group_source,
                    rank=launch.rank,
                    world_size=launch.world_size,
                    timeout=wait,
                )
            except (RuntimeError, ValueError) as error:  # DistStoreError, timeouts
                raise LaunchError(
                    f"rank {launch.rank} of {launch.world_size} ({launch.source} launch) could "
                    f"not join the rendezvous at {endpoint} within {wait.total_seconds():g} s: "
                    "check that rank 0 runs and that this host can reach that address and port "
                    f"(BATON_RENDEZVOUS_TIMEOUT sets the wait) [{type(error).__name__}]"
                ) from error
        else:
            fd, self._store_file = tempfile.mkstemp(prefix="baton-store-")
            os.close(fd)
            dist.init_process_group(
                backend, init_method=f"file://{self._store_file}", rank=0, world_size=1
            )
        self._owns_process_group = True
        return launch

    def teardown_process_group(self) -> None:
        """Destroy the group if ``init_process_group`` created it."""
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_process_group = False
        if self._store_file is not None:
            Path(self._store_file).unlink(missing_ok=True)
            self._store_file = None

    def barrier(self) -> None:
        barrier()

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return all_reduce_flags(flags, self.device)

    def broadcast(self, value: Any) -> Any:
        """Global rank 0's ``value`` (any picklable object) on every rank; a collective
        every rank calls. Without a group of two or more ranks, ``value`` itself."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    @staticmethod
    def fetch(values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return fetch(values)


class UsesTorchDistributed:
    """A backend whose ranks, barrier, flags and host transfers are its ``runtime``'s (a
    ``TorchDistributed``): each hands over to it. Composed before ``BackendBase`` by the
    TorchTitan and Megatron-Core backends (and ``examples/minimal_backend.py``), which
    build the runtime in ``__init__``."""

    #: the process group and device the backend trains on
    runtime: TorchDistributed

    @property
    def rank(self) -> int:
        return self.runtime.rank

    @property
    def world_size(self) -> int:
        return self.runtime.world_size

    @property
    def device_type(self) -> str:
        return self.runtime.device_type

    def barrier(self) -> None:
        self.runtime.barrier()

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return self.runtime.all_reduce_flags(flags)

    def broadcast(self, value: Any) -> Any:
        """Global rank 0's ``value`` on every rank (a collective every rank calls)."""
        return self.runtime.broadcast(value)

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return self.runtime.fetch(values)
