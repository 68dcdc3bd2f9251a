"""The JAX multi-process plumbing every JAX backend shares: ``jax.distributed`` from the
launch, rank and world size (processes), barrier, flag all-reduce, one-transfer ``fetch``.

A backend mixes it in before ``BackendBase``::

    class MyJaxBackend(JaxDistributed, BackendBase):
        def setup(self) -> None:
            self.initialize_distributed()   # SLURM, BATON_* or torchrun-style variables
            ...

``initialize_distributed`` calls ``jax.distributed.initialize`` only when the launch
has more than one process (``baton.core.launch.Launch``: the coordinator is rank 0's
host, ``BATON_COORDINATOR`` (``host:port``) overrides it). It must run before anything
touches a JAX device. Ranks here are JAX processes (hosts), not devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from baton.core.launch import Launch, LaunchError, rendezvous_timeout_s


def coordinator_address(launch: Launch) -> str:
    """``host:port`` of process 0, where ``jax.distributed`` rendezvous."""
    explicit = os.environ.get("BATON_COORDINATOR")
    if explicit:
        return explicit
    if launch.master_addr is None or launch.master_port is None:
        raise LaunchError(
            f"{launch.source} launch of {launch.world_size} JAX processes names no "
            "coordinator: set BATON_COORDINATOR=host:port (or BATON_MASTER_ADDR/PORT)"
        )
    return f"{launch.master_addr}:{launch.master_port}"


def fetch(values: Mapping[str, Any]) -> dict[str, float]:
    """Every value to the host in one ``jax.device_get``; callables are called first."""
    import jax

    ready = {k: v() if callable(v) else v for k, v in values.items()}
    host = jax.device_get(ready)
    return {k: float(np.asarray(v)) for k, v in host.items()}


def all_reduce_flags(flags: list[bool]) -> list[bool]:
    """OR of each flag over every JAX process (local with one process)."""
    import jax

    if jax.process_count() == 1:
        return list(flags)
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array(flags, dtype=np.int32))
    return [bool(v) for v in np.asarray(gathered).reshape(-1, len(flags)).max(axis=0)]


def barrier(name: str = "baton_barrier") -> None:
    """Wait for every JAX process (no-op with one)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class JaxDistributed:
    """Mixin: process rank and count, ``barrier``, ``all_reduce_flags`` and ``fetch``."""

    _initialized_distributed: bool = False

    @property
    def rank(self) -> int:
        if not self._jax_started():
            return Launch.from_env().rank
        import jax

        return jax.process_index()

    @property
    def world_size(self) -> int:
        if not self._jax_started():
            return Launch.from_env().world_size
        import jax

        return jax.process_count()

    @property
    def device_type(self) -> str:
        if not self._jax_started():
            return "cpu"
        import jax

        return jax.devices()[0].platform

    def _jax_started(self) -> bool:
        import sys

        return "jax" in sys.modules and (
            self._initialized_distributed or not Launch.from_env().distributed
        )

    def initialize_distributed(self) -> Launch:
        """``jax.distributed.initialize`` for a multi-process launch (once per process)."""
        launch = Launch.from_env()
        if launch.distributed and not self._initialized_distributed:
            import jax

            if not jax.distributed.is_initialized():
                jax.distributed.initialize(
                    coordinator_address=coordinator_address(launch),
                    num_processes=launch.world_size,
                    process_id=launch.rank,
                    local_device_ids=None,
                    initialization_timeout=int(rendezvous_timeout_s()),
                )
            self._initialized_distributed = True
        return launch

    def barrier(self) -> None:
        barrier()

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return all_reduce_flags(flags)

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Everything to the host in one ``jax.device_get``."""
        return fetch(values)
