"""The Fabric runtime that the Fabric and LightningModule backends both compose: the
launched ``lightning.fabric.Fabric`` (precision, strategy, device, the process group),
the ranks and collectives core asks a backend for, and ``TrainingParts``, the record of
what a run trains that its checkpoint I/O, model-state view and corruption checks are
handed.

Example::

    runtime = FabricRuntime()
    fabric = runtime.launch(FabricConfig(precision="bf16-mixed"))  # torchrun: baton's group
    runtime.rank, runtime.world_size, runtime.device
    runtime.all_reduce_flags([stop])   # OR over the ranks
    parts = TrainingParts(net, fabric_net, optimizers=(optimizer,), schedulers=())
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from baton.backends import torch_distributed
from baton.backends.fabric.build import is_sharded, launch_fabric, make_fabric
from baton.backends.fabric.config import FabricConfig
from baton.core.launch import Launch


@dataclass(frozen=True)
class TrainingParts:
    """What one run trains, as its backend's ``setup`` built it.

    Args:
        raw_model: the user's module (names, Hugging Face config, checksums).
        model: the module as Fabric set it up (the forward and the saved ``"model"``).
        optimizers: the optimizers as Fabric set them up; the first is the checkpoint's
            ``"optimizer"`` (a LightningModule may return several).
        schedulers: the learning-rate schedulers stepped with them.
    """

    raw_model: nn.Module
    model: Any
    optimizers: tuple[Any, ...]
    schedulers: tuple[Any, ...] = ()

    @property
    def optimizer(self) -> Any:
        """The first (with the Fabric backend, the only) optimizer."""
        return self.optimizers[0]


class FabricRuntime:
    """One run's Fabric and the ranks it spans, before and after ``launch``.

    Before ``launch`` the ranks are the launcher's (``Launch.from_env``) and the device
    the CPU; ``launch`` builds the ``Fabric`` of a ``FabricConfig`` and this process's
    launch.
    """

    def __init__(self) -> None:
        #: the launched ``lightning.fabric.Fabric`` (``None`` before ``launch``)
        self.fabric: Any = None
        #: the device the run trains and reduces its flags on
        self.device = torch.device("cpu")
        self._group = torch_distributed.TorchDistributed()

    def launch(self, config: FabricConfig, *, join_baton_group: bool = True) -> Any:
        """The Fabric of ``config``, built and launched. With ``join_baton_group``, a torchrun process first
        joins baton's process group (safe across elastic restarts), which Fabric then
        uses; without, Fabric makes its own (as ``Trainer.fit`` does)."""
        join = self._group.init_process_group if join_baton_group else None
        self.fabric = launch_fabric(make_fabric(config), join_group=join)
        self.device = self.fabric.device
        return self.fabric

    @property
    def rank(self) -> int:
        return self.fabric.global_rank if self.fabric is not None else Launch.from_env().rank

    @property
    def world_size(self) -> int:
        if self.fabric is not None:
            return self.fabric.world_size
        return Launch.from_env().world_size

    @property
    def device_type(self) -> str:
        return self.fabric.device.type if self.fabric is not None else "cpu"

    @property
    def sharded(self) -> bool:
        """Whether the strategy shards the parameters (FSDP, model parallel)."""
        return is_sharded(self.fabric)

    def barrier(self) -> None:
        torch_distributed.barrier()

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return torch_distributed.all_reduce_flags(flags, self.device)

    @staticmethod
    def fetch(values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return torch_distributed.fetch(values)


class UsesFabricRuntime:
    """A backend whose ranks, barrier, flags and host transfers are its ``runtime``'s
    (a ``FabricRuntime``): each hands over to it. Composed beside ``BackendBase`` by the
    Fabric and the LightningModule backends, which precede it in the bases."""

    #: the launched Fabric, its device and ranks
    runtime: FabricRuntime

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

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return self.runtime.fetch(values)


@dataclass
class ModelFacts:
    """What a Fabric-run model reports: FLOPs per token for MFU (given, else 6 x its
    parameters) and the facts checkpoints record (given ones, then the model's class and
    size). ``parameters`` is counted in ``setup``::

        facts = ModelFacts(flops_per_token=None, given={"data": "wiki"})
        facts.parameters = 1_000
        facts.flops_per_token                # 6000.0
        facts.describe(model)                # {"data": "wiki", "model": "GPT", "parameters": 1000}
    """

    flops_given: float | None = None
    given: Mapping[str, Any] = field(default_factory=dict[str, Any])
    parameters: int = 0

    @property
    def flops_per_token(self) -> float | None:
        if self.flops_given is not None:
            return self.flops_given
        return 6.0 * self.parameters if self.parameters else None

    def describe(self, model: Any) -> dict[str, Any]:
        facts: dict[str, Any] = dict(self.given)
        if model is not None:
            facts.setdefault("model", type(model).__name__)
            facts.setdefault("parameters", self.parameters)
        return facts
