"""The Fabric backend's native config: how the user's model is trained.

Example::

    from baton.backends.fabric import FabricConfig
    config = FabricConfig(precision="bf16-mixed", grad_clip=1.0, grad_accum=4)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.launch import Launch


@dataclass
class FabricConfig:
    """How the user's model is trained (the backend's native config, editable in
    ``on_configure``). ``devices``/``num_nodes`` left ``None`` come from the launcher
    (torchrun, SLURM, ``BATON_*``); ``strategy="auto"`` is DDP when there are several
    processes."""

    accelerator: str = "auto"
    devices: int | str | None = None
    num_nodes: int | None = None
    #: ``auto``, ``ddp``, ``fsdp`` or any strategy name Fabric knows
    strategy: str = "auto"
    #: ``32-true``, ``bf16-mixed``, ``16-mixed``, ``bf16-true``, ...
    precision: str = "32-true"
    grad_accum: int = 1
    grad_clip: float | None = None
    #: seeds torch, numpy and random before the model is built (``None``: leave as is)
    seed: int | None = None
    #: at the end of the training data: ``continue`` (next epoch) or ``stop`` the run
    on_epoch_end: str = "continue"
    #: evaluate on at most this many batches of the evaluation data (``None``: all)
    eval_batches: int | None = None
    #: weights to start from (a Hugging Face model directory, a baton checkpoint, a
    #: ``.safetensors``/``.pt`` file): weights only, fresh optimizer, step 0
    init_from: str | None = None

    def check(self) -> None:
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(
                f"grad_clip must be > 0 (or None for no clipping), got {self.grad_clip}"
            )
        if self.on_epoch_end not in ("continue", "stop"):
            raise ValueError(
                f"on_epoch_end must be 'continue' or 'stop', got {self.on_epoch_end!r}"
            )
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(
                f"eval_batches must be >= 1 (or None for all), got {self.eval_batches}"
            )


def fabric_arguments(config: FabricConfig, launch: Launch) -> dict[str, Any]:
    """``Fabric(...)``'s arguments: the config's, with devices, nodes and the strategy
    (DDP for several processes) taken from the launch where the config leaves them."""
    devices = config.devices if config.devices is not None else launch.local_world_size
    num_nodes = config.num_nodes if config.num_nodes is not None else launch.num_nodes
    strategy = config.strategy
    if strategy == "auto" and launch.distributed:
        strategy = "ddp"
    return {
        "accelerator": config.accelerator,
        "devices": devices,
        "num_nodes": num_nodes,
        "strategy": strategy,
        "precision": config.precision,
    }
