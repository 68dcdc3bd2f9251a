"""The torch.distributed plumbing every torch backend shares: process group from the
launch, rank and world size, barrier, flag all-reduce, and the one-transfer ``fetch``.

A backend mixes it in before ``BackendBase`` and says which device its collectives use::

    class MyBackend(TorchDistributed, BackendBase):
        def setup(self) -> None:
            self.init_process_group()          # torchrun, SLURM, BATON_* or one process
            ...

``init_process_group`` reads the launch the same way for every backend
(``baton.core.launch.Launch``); a process started by SLURM without torchrun (or with
``BATON_*`` settings) joins rank 0's TCP store directly, within
``BATON_RENDEZVOUS_TIMEOUT`` seconds, or fails naming the endpoint. One that nobody launched gets a one-rank group on a
file store (no port to collide on). The group is destroyed in ``teardown_process_group``
only if this backend created it.
"""

from __future__ import annotations

import os
import tempfile
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


class TorchDistributed:
    """Mixin: rank, world size, ``barrier``, ``all_reduce_flags`` and ``fetch`` over
    torch.distributed; ``init_process_group`` / ``teardown_process_group`` around a run.

    ``self._device`` is the device collectives and flags live on (set it in ``setup``
    when training on an accelerator).
    """

    _device: torch.device = torch.device("cpu")
    _owns_process_group: bool = False
    _store_file: str | None = None

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
        return self._device.type

    def init_process_group(
        self, backend: str = "auto", *, timeout: timedelta | None = None
    ) -> Launch:
        """Join (or create) the default process group as the launch says; pick the
        device (``cuda:LOCAL_RANK`` when CUDA is available). Returns the launch."""
        launch = Launch.from_env()
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(launch.local_rank)
            self._device = torch.device("cuda", launch.local_rank)
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
                dist.init_process_group(
                    backend,
                    init_method=init,
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
        return all_reduce_flags(flags, self._device)

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return fetch(values)
