"""Plain PyTorch through Lightning Fabric: baton's small built-in backend.

Fabric supplies the device, precision and distributed strategy (DDP, FSDP; launched
by torchrun or SLURM); the step is ordinary PyTorch: forward, ``fabric.backward``,
gradient clipping, ``optimizer.step``, scheduler step.

Example::

    from baton.core import Driver
    from baton.backends.fabric import FabricBackend, GPTConfig

    backend = FabricBackend(model=GPTConfig(n_layer=4), batch_size=16, lr=1e-3)
    Driver(backend, max_steps=200, run_dir="runs/tiny").fit()
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from baton.backends.fabric.data import ByteCorpus, WindowSampler, eval_batches
from baton.backends.fabric.model import GPT, GPTConfig
from baton.core.backend import BackendBase, PendingSave
from baton.core.metrics import StepOutput

STATE_FILE = "state.pt"


@dataclass
class FabricConfig:
    """The native config of the Fabric backend (editable in ``on_configure``)."""

    model: GPTConfig = field(default_factory=GPTConfig)
    data_path: str | None = None
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 20
    decay_steps: int | None = None
    grad_clip: float | None = 1.0
    seed: int = 0
    eval_batches: int = 8
    accelerator: str = "auto"
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"


class FabricBackend(BackendBase):
    """Plain PyTorch models through lightning.fabric.Fabric (device, precision, DDP/FSDP)."""

    name = "fabric"
    distribution = "lightning"

    def __init__(self, config: FabricConfig | None = None, **overrides: Any) -> None:
        self.config = config or FabricConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"FabricConfig has no field {key!r}")
            setattr(self.config, key, value)
        self.fabric: Any = None
        self.model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.sampler: WindowSampler | None = None
        self._val: list[tuple[torch.Tensor, torch.Tensor]] = []

    # -- facts ----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.fabric.global_rank if self.fabric is not None else 0

    @property
    def world_size(self) -> int:
        return self.fabric.world_size if self.fabric is not None else 1

    @property
    def device_type(self) -> str:
        return self.fabric.device.type if self.fabric is not None else "cpu"

    @property
    def flops_per_token(self) -> float:
        return self.config.model.flops_per_token()

    def describe(self) -> dict[str, Any]:
        return {"model": self.config.model.to_dict()}

    # -- build ------------------------------------------------------------------------
    def setup(self) -> None:
        from lightning.fabric import Fabric

        cfg = self.config
        self.fabric = Fabric(
            accelerator=cfg.accelerator,
            devices=cfg.devices,
            num_nodes=cfg.num_nodes,
            strategy=cfg.strategy,
            precision=cfg.precision,  # type: ignore[arg-type]
        )
        self.fabric.launch()
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.model)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=cfg.betas,
        )
        self.model, self.optimizer = self.fabric.setup(model, optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda())
        corpus = ByteCorpus.load(cfg.data_path)
        if cfg.model.vocab_size < 256:
            raise ValueError(f"byte-level data needs vocab_size >= 256, got {cfg.model.vocab_size}")
        self.sampler = WindowSampler(
            corpus.train,
            seq_len=cfg.model.seq_len,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            rank=self.fabric.global_rank,
            world_size=self.fabric.world_size,
        )
        self._val = eval_batches(
            corpus.val,
            seq_len=cfg.model.seq_len,
            batch_size=cfg.batch_size,
            num_batches=cfg.eval_batches,
        )

    def _lr_lambda(self) -> Callable[[int], float]:
        cfg = self.config

        def factor(step: int) -> float:
            if step < cfg.warmup_steps:
                return (step + 1) / cfg.warmup_steps
            if cfg.decay_steps is None:
                return 1.0
            progress = min(
                1.0, (step - cfg.warmup_steps) / max(1, cfg.decay_steps - cfg.warmup_steps)
            )
            return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (
                1 + math.cos(math.pi * progress)
            )

        return factor

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        assert (
            self.sampler is not None and self.optimizer is not None and self.scheduler is not None
        )
        fabric, cfg = self.fabric, self.config
        lr = self.scheduler.get_last_lr()[0]
        total = torch.zeros((), device=fabric.device)
        for micro in range(cfg.grad_accum):
            x, y = self.sampler.next_batch()
            x, y = fabric.to_device((x, y))
            with fabric.no_backward_sync(self.model, enabled=micro < cfg.grad_accum - 1):
                loss = self.model(x, y) / cfg.grad_accum
                fabric.backward(loss)
            total += loss.detach()
        metrics: dict[str, Any] = {"lr": lr}
        if cfg.grad_clip is not None:
            # error_if_nonfinite=False: checking would sync with the device every step;
            # a non-finite loss or norm is the LossGuard callback's job, on log steps.
            metrics["grad_norm"] = fabric.clip_gradients(
                self.model, self.optimizer, max_norm=cfg.grad_clip, error_if_nonfinite=False
            )
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        samples = cfg.batch_size * cfg.grad_accum * fabric.world_size
        return StepOutput(
            loss=total, metrics=metrics, tokens=samples * cfg.model.seq_len, samples=samples
        )

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        out: dict[str, float] = {}
        keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
        if keys:
            stacked = (
                torch.stack([values[k].detach().float().reshape(()) for k in keys]).cpu().tolist()
            )
            out.update(zip(keys, stacked, strict=True))
        for k, v in values.items():
            if k not in out:
                out[k] = float(v)
        return out

    @torch.no_grad()
    def evaluate(self) -> Mapping[str, Any]:
        if not self._val:
            raise RuntimeError("no validation windows: the corpus' validation split is too small")
        self.model.eval()
        losses = [self.model(*self.fabric.to_device(batch)) for batch in self._val]
        self.model.train()
        return {"loss": torch.stack(losses).mean()}

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        if self.world_size == 1:
            return list(flags)
        tensor = torch.tensor([float(f) for f in flags], device=self.fabric.device)
        reduced = self.fabric.all_reduce(tensor, reduce_op="sum")
        return [bool(v > 0) for v in reduced.tolist()]

    def barrier(self) -> None:
        if self.fabric is not None and self.world_size > 1:
            self.fabric.barrier()

    def skip_data(self, steps: int) -> None:
        """Draw and discard ``steps`` optimizer steps' worth of batches."""
        assert self.sampler is not None
        for _ in range(steps * self.config.grad_accum):
            self.sampler.next_batch()

    # -- checkpoints ----------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    @property
    def supports_async_save(self) -> bool:  # type: ignore[override]
        """Single-device and DDP states are whole on rank 0: a host copy is written by a
        thread with ``torch.save`` (the file Fabric's default checkpoint IO writes).
        Sharded strategies (FSDP) and custom checkpoint IO save synchronously."""
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
        from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy

        strategy = self.fabric.strategy
        return isinstance(strategy, SingleDeviceStrategy | DDPStrategy) and (
            type(strategy.checkpoint_io) is TorchCheckpointIO
        )

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        assert self.sampler is not None
        state = self._state()
        state["data"] = self.sampler.state_dict()
        state["rng"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and self.fabric.device.type == "cuda":
            state["rng"]["cuda"] = torch.cuda.get_rng_state(self.fabric.device)
        path = Path(directory) / STATE_FILE
        if not (asynchronous and self.supports_async_save):
            self.fabric.save(path, state)
            return None
        # the same content fabric.save writes, copied to host memory now (so training may
        # change the live tensors), then written by a background thread
        strategy = self.fabric.strategy
        state["model"] = strategy.get_module_state_dict(self.model.module)
        state["optimizer"] = strategy.get_optimizer_state(self.optimizer.optimizer)
        state["scheduler"] = self.scheduler.state_dict()
        snapshot = _host_copy(state)
        if not strategy.is_global_zero:
            return ThreadedSave(lambda: None)  # every rank hands back a handle alike
        # the file fabric.save writes through TorchCheckpointIO is this torch.save
        return ThreadedSave(lambda: torch.save(snapshot, path))

    def load(self, directory: Path) -> None:
        assert self.sampler is not None
        state = self._state()
        remainder = self.fabric.load(Path(directory) / STATE_FILE, state)
        self.sampler.load_state_dict(remainder["data"])
        torch.set_rng_state(remainder["rng"]["torch"])
        if "cuda" in remainder["rng"] and self.fabric.device.type == "cuda":
            torch.cuda.set_rng_state(remainder["rng"]["cuda"], self.fabric.device)


def _host_copy(value: Any) -> Any:
    """A deep copy with every tensor cloned into host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_copy(v) for v in value)
    return value


class ThreadedSave:
    """A write running on a background thread; ``wait`` re-raises what it raised.

    Example::

        pending = ThreadedSave(lambda: torch.save(state, path))
        ...            # training continues
        pending.wait()
    """

    def __init__(self, write: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(write,), daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as error:
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
