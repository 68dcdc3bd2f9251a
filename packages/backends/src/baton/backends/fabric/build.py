"""Building a Fabric run: Fabric itself, launched (under torchrun in baton's process
group), then the model and optimizer from what the user passed: an ``nn.Module`` or a
factory, an optimizer or a factory taking the set-up model.

Example (what ``FabricBackend.setup`` does, through ``runtime.FabricRuntime``)::

    fabric = launch_fabric(make_fabric(config), join_group=TorchDistributed().init_process_group)
    sharded = is_sharded(fabric)                      # FSDP: build empty, then shard
    model = build_model(fabric, lambda: MyNet(), sharded=sharded)
    wrapped, optimizer = setup_model_and_optimizer(
        fabric, model, lambda m: torch.optim.AdamW(m.parameters()), sharded=sharded
    )
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from baton.backends.fabric.config import FabricConfig, fabric_arguments
from baton.core.launch import Launch

ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def make_fabric(config: FabricConfig) -> Any:
    """A ``lightning.fabric.Fabric`` for ``config`` and this process's launch."""
    from lightning.fabric import Fabric

    return Fabric(**fabric_arguments(config, Launch.from_env()))


def launch_fabric(fabric: Any, join_group: Callable[[str], Any] | None = None) -> Any:
    """``fabric`` launched. Under torchrun, ``join_group(backend)`` (where given) first
    joins baton's process group (safe across torchrun's elastic restarts), which Fabric
    then uses; without it Fabric makes its own.
    Like Fabric's own, it outlives the run (collectives after fit, a next run in the
    same process); whatever group is live is destroyed at interpreter exit, Gloo's too:
    Fabric does so only for NCCL, and a Gloo group left to the interpreter's finalization
    can abort the process after a successful run ("terminate called without an active
    exception": its worker threads still hold work when Python is torn down)."""
    if join_group is not None and Launch.from_env().source == "torchrun":
        join_group("nccl" if fabric.device.type == "cuda" else "gloo")
    fabric.launch()
    destroy_group_at_exit()
    return fabric


def destroy_group_at_exit() -> None:
    """If a process group exists, destroy it at interpreter exit (registered once per
    process), while Python can still run what the group's threads release."""
    import torch.distributed as dist

    if dist.is_initialized():
        _register_exit_hook()


@functools.cache
def _register_exit_hook() -> None:
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    """Destroy the default process group if it still exists (at interpreter exit)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def is_sharded(fabric: Any) -> bool:
    """Whether ``fabric``'s strategy shards the parameters (FSDP, model parallel)."""
    from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy

    return isinstance(fabric.strategy, FSDPStrategy | ModelParallelStrategy)


def build_model(
    fabric: Any, source: nn.Module | ModelFactory | None, *, sharded: bool
) -> nn.Module:
    """The model: ``source`` itself, or what the factory returns (built inside
    ``fabric.init_module`` without allocating weights when ``sharded``)."""
    if source is None:
        raise ValueError("FabricBackend needs a model: an nn.Module or a factory returning one")
    if isinstance(source, nn.Module):
        return source
    if sharded:
        with fabric.init_module(empty_init=True):
            model = source()
    else:
        model = source()
    if not isinstance(model, nn.Module):
        raise TypeError(f"the model factory returned {type(model).__name__}, not an nn.Module")
    return model


def setup_model_and_optimizer(
    fabric: Any,
    model: nn.Module,
    source: OptimizerFactory | torch.optim.Optimizer | None,
    *,
    sharded: bool,
) -> tuple[Any, Any]:
    """The model and optimizer set up by ``fabric``: a factory is called with the set-up
    (possibly sharded) model; a ready optimizer only fits an unsharded one."""
    if source is None:
        raise ValueError(
            "FabricBackend needs an optimizer: optimizer=lambda model: "
            "torch.optim.AdamW(model.parameters(), lr=1e-3)"
        )
    if isinstance(source, torch.optim.Optimizer):
        if sharded:
            raise ValueError(
                "a sharded strategy builds the optimizer after the model is sharded: pass "
                "an optimizer factory (optimizer=lambda model: AdamW(model.parameters()))"
            )
        return fabric.setup(model, source)
    wrapped = fabric.setup_module(model)
    optimizer = source(wrapped)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"the optimizer factory returned {type(optimizer).__name__}, not a torch optimizer"
        )
    return wrapped, fabric.setup_optimizers(optimizer)
