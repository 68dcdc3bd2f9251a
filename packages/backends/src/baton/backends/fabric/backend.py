"""Plain PyTorch through Lightning Fabric: bring your own model, optimizer and data.

Fabric supplies the device, precision and distributed strategy (DDP, FSDP; launched by
torchrun or SLURM, read through ``baton.core.launch.Launch``); the step is ordinary
PyTorch: forward, ``fabric.backward``, gradient clipping, ``optimizer.step``, scheduler
step. The backend knows nothing about the model: it takes the user's pieces.

Example::

    from baton.backends.fabric import FabricBackend, FabricConfig
    from baton.core import Driver

    backend = FabricBackend(
        model=MyNet(),                                      # or a factory: lambda: MyNet()
        optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=1e-3),
        data=DataLoader(train_set, batch_size=32, shuffle=True),
        loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        eval_data=DataLoader(val_set, batch_size=64),
        config=FabricConfig(grad_clip=1.0, precision="bf16-mixed"),
    )
    Driver(backend, max_steps=1000, run_dir="runs/mine").fit()

The loss of a step is, in this order: ``training_step(model, batch)`` (a loss, or a dict
with ``"loss"`` and other metrics), ``loss_fn(model, batch)``, or what the model returns
for the batch (``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else
``model(batch)``): a scalar tensor, or an object with ``.loss`` (Hugging Face outputs).
"""

from __future__ import annotations

import atexit
import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from baton.backends import torch_distributed
from baton.backends.fabric.changes import LR_SETTINGS, SCHEDULE_SETTINGS, AsBuilt
from baton.backends.fabric.gradients import GradientWatchers
from baton.backends.fabric.stream import BatchStream, count_batch
from baton.backends.fabric.weights import HF_CONFIG_DIR, STATE_FILE, load_weights
from baton.core.backend import BackendBase, PendingSave
from baton.core.launch import Launch
from baton.core.metrics import StepOutput

ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
StepFn = Callable[[nn.Module, Any], Any]


def _destroy_process_group() -> None:
    """Destroy the default process group if it still exists (at interpreter exit)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


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


class FabricBackend(torch_distributed.TorchDistributed, GradientWatchers, BackendBase):
    """Any PyTorch model, optimizer and data through lightning.fabric.Fabric (DDP/FSDP, precision).

    Args:
        model: an ``nn.Module``, or a factory returning one (built inside
            ``fabric.init_module`` so FSDP can build it sharded).
        optimizer: ``optimizer(model) -> Optimizer`` called with the set-up model.
        data: the training batches: any ``DataLoader`` (torchdata's ``StatefulDataLoader``
            for an exact data position on resume) or re-iterable of batches.
        loss_fn / training_step: how a batch becomes a loss (see the module docs).
        scheduler: ``scheduler(optimizer) -> LRScheduler``, stepped after every optimizer step.
        eval_data: the evaluation batches (``evaluate`` averages the loss over them).
        count_tokens: ``count_tokens(batch) -> int`` where the tokens of a batch are not
            its 2-D integer tensor's size.
        flops_per_token: training FLOPs per token for MFU (default: 6 x parameters).
        describe: facts recorded in checkpoints; a resume with different ones fails.
        config: a ``FabricConfig``; keyword ``overrides`` set its fields.
    """

    name = "fabric"
    distribution = "lightning"

    def __init__(
        self,
        model: nn.Module | ModelFactory | None = None,
        optimizer: OptimizerFactory | torch.optim.Optimizer | None = None,
        data: Iterable[Any] | None = None,
        *,
        loss_fn: StepFn | None = None,
        training_step: StepFn | None = None,
        scheduler: SchedulerFactory | None = None,
        eval_data: Iterable[Any] | None = None,
        count_tokens: Callable[[Any], int] | None = None,
        flops_per_token: float | None = None,
        describe: Mapping[str, Any] | None = None,
        config: FabricConfig | None = None,
        **overrides: Any,
    ) -> None:
        self.config = config or FabricConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"FabricConfig has no field {key!r}")
            setattr(self.config, key, value)
        if loss_fn is not None and training_step is not None:
            raise ValueError("pass either loss_fn or training_step, not both")
        self.model_source = model
        self.optimizer_source = optimizer
        self.scheduler_source = scheduler
        self.data = data
        self.eval_data = eval_data
        self.loss_fn = loss_fn
        self.training_step = training_step
        self.count_tokens = count_tokens
        self._flops_per_token = flops_per_token
        self._describe = dict(describe or {})
        self.fabric: Any = None
        self.model: Any = None
        self.raw_model: nn.Module | None = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.stream: BatchStream | None = None
        self._num_params = 0
        self._checked = False
        self._as_built: AsBuilt | None = None

    # -- facts ----------------------------------------------------------------------
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
    def flops_per_token(self) -> float | None:
        if self._flops_per_token is not None:
            return self._flops_per_token
        return 6.0 * self._num_params if self._num_params else None

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = dict(self._describe)
        if self.raw_model is not None:
            facts.setdefault("model", type(self.raw_model).__name__)
            facts.setdefault("parameters", self._num_params)
        return facts

    # -- build ------------------------------------------------------------------------
    def setup(self) -> None:
        self.config.check()
        self.fabric = self._make_fabric()
        if Launch.from_env().source == "torchrun":
            # baton's group (safe across torchrun's elastic restarts); Fabric then uses it.
            # Like Fabric's own, it outlives the run (collectives after fit, a next run in
            # the same process); an NCCL group is destroyed at exit, as Fabric does.
            backend = "nccl" if self.fabric.device.type == "cuda" else "gloo"
            self.init_process_group(backend)
            if backend == "nccl":
                atexit.register(_destroy_process_group)
        self.fabric.launch()
        self._device = self.fabric.device
        if self.config.seed is not None:
            from lightning.fabric.utilities.seed import seed_everything

            seed_everything(self.config.seed, verbose=False)
        self.raw_model = self._build_model()
        self._num_params = sum(p.numel() for p in self.raw_model.parameters())
        if self.config.init_from:
            load_weights(self.raw_model, self.config.init_from)
        self.model, self.optimizer = self._setup_model_and_optimizer(self.raw_model)
        self.scheduler = (
            self.scheduler_source(self.optimizer) if self.scheduler_source is not None else None
        )
        self.stream = self._make_stream(self._training_data())
        self._as_built = AsBuilt.take(self.optimizer, self._schedulers())

    def _schedulers(self) -> list[Any]:
        """The learning-rate schedulers stepped with the optimizer."""
        return [self.scheduler] if self.scheduler is not None else []

    def _fabric_class(self) -> type:
        from lightning.fabric import Fabric

        return Fabric

    def _make_fabric(self) -> Any:
        cfg, launch = self.config, Launch.from_env()
        devices = cfg.devices if cfg.devices is not None else launch.local_world_size
        num_nodes = cfg.num_nodes if cfg.num_nodes is not None else launch.num_nodes
        strategy = cfg.strategy
        if strategy == "auto" and launch.distributed:
            strategy = "ddp"
        return self._fabric_class()(
            accelerator=cfg.accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            precision=cfg.precision,  # type: ignore[arg-type]
        )

    def _sharded(self) -> bool:
        from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy

        return isinstance(self.fabric.strategy, FSDPStrategy | ModelParallelStrategy)

    def _build_model(self) -> nn.Module:
        source = self.model_source
        if source is None:
            raise ValueError("FabricBackend needs a model: an nn.Module or a factory returning one")
        if isinstance(source, nn.Module):
            return source
        if self._sharded():
            with self.fabric.init_module(empty_init=True):
                model = source()
        else:
            model = source()
        if not isinstance(model, nn.Module):
            raise TypeError(f"the model factory returned {type(model).__name__}, not an nn.Module")
        return model

    def _setup_model_and_optimizer(self, model: nn.Module) -> tuple[Any, Any]:
        source = self.optimizer_source
        if source is None:
            raise ValueError(
                "FabricBackend needs an optimizer: optimizer=lambda model: "
                "torch.optim.AdamW(model.parameters(), lr=1e-3)"
            )
        if isinstance(source, torch.optim.Optimizer):
            if self._sharded():
                raise ValueError(
                    "a sharded strategy builds the optimizer after the model is sharded: pass "
                    "an optimizer factory (optimizer=lambda model: AdamW(model.parameters()))"
                )
            return self.fabric.setup(model, source)
        wrapped = self.fabric.setup_module(model)
        optimizer = source(wrapped)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(optimizer).__name__}, not a torch optimizer"
            )
        return wrapped, self.fabric.setup_optimizers(optimizer)

    def _training_data(self) -> Iterable[Any]:
        if self.data is None:
            raise ValueError("FabricBackend needs training data: data=DataLoader(...) or a list")
        return self.data

    def _make_stream(self, data: Iterable[Any]) -> BatchStream:
        from torch.utils.data import DataLoader, DistributedSampler

        use_loader_state = True
        if (
            self.fabric.world_size > 1
            and isinstance(data, DataLoader)
            and not isinstance(data.sampler, DistributedSampler)
            and not isinstance(data.dataset, torch.utils.data.IterableDataset)
        ):
            # each rank reads its own shard: Fabric re-makes the loader with a
            # DistributedSampler (seeded, per epoch). Its position is then counted and
            # skipped on resume: the re-made loader's own state did not restore exactly.
            wrapped = self.fabric.setup_dataloaders(data, move_to_device=False)
            data = getattr(wrapped, "_dataloader", wrapped)
            use_loader_state = False
        return BatchStream(
            data,
            on_epoch_end=self.config.on_epoch_end,
            epoch_ended=self._epoch_ended,
            use_loader_state=use_loader_state,
        )

    def _epoch_ended(self, epoch: int) -> None:
        """Called when epoch ``epoch`` of the training data is used up."""

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        assert self.stream is not None and self.optimizer is not None
        fabric, cfg = self.fabric, self.config
        metrics: dict[str, Any] = {"lr": self.optimizer.param_groups[0]["lr"]}
        total: torch.Tensor | None = None
        samples = tokens = 0
        for micro in range(cfg.grad_accum):
            batch = fabric.to_device(self.stream.next())
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
            with fabric.no_backward_sync(self.model, enabled=micro < cfg.grad_accum - 1):
                loss, extra = self._loss(batch, micro)
                fabric.backward(loss if cfg.grad_accum == 1 else loss / cfg.grad_accum)
            total = loss.detach() if total is None else total + loss.detach()
            metrics.update(extra)
        assert total is not None
        assert self.raw_model is not None
        self.show_gradients(self.raw_model)
        if cfg.grad_clip is not None:
            # error_if_nonfinite=False: checking would sync with the device every step;
            # a non-finite loss or norm is the LossGuard callback's job, on log steps.
            metrics["grad_norm"] = fabric.clip_gradients(
                self.model, self.optimizer, max_norm=cfg.grad_clip, error_if_nonfinite=False
            )
        self._optimizer_step()
        world = fabric.world_size
        return StepOutput(
            loss=total if cfg.grad_accum == 1 else total / cfg.grad_accum,
            metrics=metrics,
            tokens=tokens * world,
            samples=samples * world,
        )

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _loss(self, batch: Any, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """The loss of one batch (and extra lazy metrics); the first call checks both."""
        if self._checked:
            return self._compute_loss(batch, index)
        try:
            loss, extra = self._compute_loss(batch, index)
        except (TypeError, ValueError, RuntimeError, IndexError, KeyError) as error:
            raise BatchError(
                f"the model rejected the first training batch ({describe_batch(batch)}): "
                f"{error}\nmake the data yield what the model's forward takes, or pass "
                "loss_fn(model, batch) / training_step(model, batch) to say how"
            ) from error
        check_loss(loss, "training")
        self._checked = True
        return loss, extra

    def _compute_loss(self, batch: Any, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if self.training_step is not None:
            return split_loss(self.training_step(self.model, batch))
        if self.loss_fn is not None:
            return self.loss_fn(self.model, batch), {}
        return split_loss(call_model(self.model, batch))

    def fetch(self, values: Mapping[str, Any]) -> dict[str, float]:
        """Every tensor to the host in one transfer; plain numbers pass through."""
        return torch_distributed.fetch(values)

    def all_reduce_flags(self, flags: list[bool]) -> list[bool]:
        return torch_distributed.all_reduce_flags(flags, self._device)

    def skip_data(self, steps: int) -> None:
        """Draw and discard ``steps`` optimizer steps' worth of batches."""
        assert self.stream is not None
        for _ in range(steps * self.config.grad_accum):
            self.stream.next()

    # -- evaluation -------------------------------------------------------------------
    def evaluate(self) -> Mapping[str, Any]:
        """The mean loss (and other metrics a step function returns) over the evaluation
        data, averaged over ranks."""
        if self.eval_data is None:
            raise ValueError("no evaluation data: pass eval_data=... to FabricBackend to evaluate")
        sums: dict[str, torch.Tensor] = {}
        count = 0
        self.model.eval()
        # evaluation draws no training randomness: a loader's seed, dropout (RNG forked)
        cuda = [self.fabric.device] if self.fabric.device.type == "cuda" else []
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=cuda):
                for index, batch in enumerate(self.eval_data):
                    if self.config.eval_batches is not None and index >= self.config.eval_batches:
                        break
                    values = self._eval_values(self.fabric.to_device(batch), index)
                    for key, value in values.items():
                        value = torch.as_tensor(value, device=self.fabric.device).float()
                        sums[key] = sums[key] + value if key in sums else value
                    count += 1
        finally:
            self.model.train()
        if count == 0:
            raise ValueError("the evaluation data yielded no batch: it is empty")
        means = {key: total / count for key, total in sums.items()}
        if self.fabric.world_size > 1:
            means = {k: self.fabric.all_reduce(v, reduce_op="mean") for k, v in means.items()}
        return means

    def _eval_values(self, batch: Any, index: int) -> dict[str, Any]:
        loss, extra = self._compute_loss(batch, index)
        check_loss(loss, "evaluation", need_grad=False)
        return {"loss": loss.detach(), **extra}

    # -- checkpoints ----------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler
        return state

    def _extra_state(self) -> dict[str, Any]:
        """Plain-data state saved next to the model (a subclass adds its own)."""
        assert self.stream is not None
        state: dict[str, Any] = {"data": self.stream.state_dict(), "rng": {}}
        state["rng"]["torch"] = torch.get_rng_state()
        if self.fabric.device.type == "cuda":
            state["rng"]["cuda"] = torch.cuda.get_rng_state(self.fabric.device)
        return state

    def _load_extra_state(self, remainder: dict[str, Any]) -> None:
        assert self.stream is not None
        self.stream.load_state_dict(remainder["data"])
        torch.set_rng_state(remainder["rng"]["torch"])
        if "cuda" in remainder["rng"] and self.fabric.device.type == "cuda":
            torch.cuda.set_rng_state(remainder["rng"]["cuda"], self.fabric.device)

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
        directory = Path(directory)
        self._save_hf_config(directory)
        self._wait_for_staging()  # an earlier save still copying the weights
        state = {**self._state(), **self._extra_state()}
        path = directory / STATE_FILE
        if not (asynchronous and self.supports_async_save):
            self.fabric.save(path, state)
            return None
        # The same content fabric.save writes. Everything is copied to host memory now
        # except the weights and the optimizer state, which only the optimizer step
        # changes: a background thread copies those while the next step's forward and
        # backward run, and that optimizer step waits for the copy (a pre-step hook).
        # Code that writes the weights outside the optimizer step right after an async
        # save (a callback editing parameters) should call _wait_for_staging() first.
        strategy = self.fabric.strategy
        state["model"] = strategy.get_module_state_dict(self.model.module)
        state["optimizer"] = strategy.get_optimizer_state(self.optimizer.optimizer)
        for key, value in state.items():
            if key not in ("model", "optimizer") and hasattr(value, "state_dict"):
                state[key] = value.state_dict()  # schedulers and other stateful objects
        staged = _host_copy(state, defer=self._step_owned_storage())
        self._install_staging_wait()
        self._staging = threading.Event()
        write = self.fabric.strategy.is_global_zero

        def copy_then_write(done: threading.Event = self._staging) -> None:
            try:
                snapshot = _finish_host_copy(staged)
            finally:
                done.set()  # the optimizer step may go on (an error surfaces in wait())
            if write:  # the file fabric.save writes through TorchCheckpointIO
                torch.save(snapshot, path)

        return ThreadedSave(copy_then_write)  # every rank hands back a handle alike

    def _step_owned_storage(self) -> set[int]:
        """Storage addresses of the tensors only ``optimizer.step`` changes: parameters and
        optimizer state (buffers such as batch-norm statistics change in forward)."""
        tensors = list(self.model.parameters())
        for per_param in self.optimizer.optimizer.state.values():
            tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
        return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}

    def _install_staging_wait(self) -> None:
        if not getattr(self, "_staging_hook", None):
            self._staging_hook = self.optimizer.optimizer.register_step_pre_hook(
                lambda *_: self._wait_for_staging()
            )

    def _wait_for_staging(self) -> None:
        """Block until an asynchronous save has copied the weights and optimizer state."""
        staging = getattr(self, "_staging", None)
        if staging is not None:
            staging.wait()
            self._staging = None

    def _save_hf_config(self, directory: Path) -> None:
        """A model carrying a Hugging Face config gets it saved beside its weights, which
        is what ``baton export --format hf`` needs."""
        config = getattr(self.raw_model, "config", None)
        if self.rank != 0 or not hasattr(config, "save_pretrained"):
            return
        config = copy.deepcopy(config)
        config.architectures = [type(self.raw_model).__name__]
        config.save_pretrained(directory / HF_CONFIG_DIR)

    def load(self, directory: Path) -> None:
        self._wait_for_staging()
        remainder = self.fabric.load(Path(directory) / STATE_FILE, self._state())
        self._load_extra_state(remainder)

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:  # type: ignore[override]
        """A changed learning rate is re-applied after loading; with a scheduler, so are
        the schedule's settings (``max_steps``, ``decay_steps``...): it is rebuilt."""
        return SCHEDULE_SETTINGS if self.scheduler_source is not None else LR_SETTINGS

    def apply_changed_settings(self, changes: Mapping[str, Any]) -> set[str]:
        """After ``load``: the learning rates and schedule the recipe built (with the new
        settings) replace the restored ones; the schedule continues at the restored step.

        Example: resumed at step 100 with ``max_steps`` 300 -> 600, the cosine schedule
        built for 600 steps goes on from its step 100; with ``lr`` changed it continues
        at the new peak. Returns the names applied."""
        assert self._as_built is not None, "apply_changed_settings is called after setup"
        return self._as_built.reapply(self.optimizer, self._schedulers(), changes)


class BatchError(ValueError):
    """A training batch the model (or the loss function) cannot take."""


def call_model(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple or list, else ``model(batch)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, list | tuple):
        return model(*batch)
    return model(batch)


def split_loss(output: Any) -> tuple[Any, dict[str, Any]]:
    """``(loss, other metrics)`` from a tensor, an object with ``.loss`` or a dict with "loss"."""
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise ValueError(
                f"the step returned a dict without 'loss' (keys: {sorted(output)}); "
                "return the loss under 'loss'"
            )
        extra = {
            k: v.detach() if isinstance(v, torch.Tensor) else v
            for k, v in output.items()
            if k != "loss" and isinstance(v, torch.Tensor | int | float) and _is_scalar(v)
        }
        return output["loss"], extra
    if not isinstance(output, torch.Tensor) and getattr(output, "loss", None) is not None:
        return output.loss, {}
    return output, {}


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, torch.Tensor) or value.numel() == 1


def check_loss(loss: Any, phase: str, *, need_grad: bool = True) -> None:
    """A loss is a floating-point scalar tensor (attached to the graph when training)."""
    fix = (
        "return a scalar loss from the model's forward (or its output's .loss), or pass "
        "loss_fn(model, batch) -> loss / training_step(model, batch) -> loss"
    )
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"the {phase} step produced {type(loss).__name__}, not a loss tensor; {fix}"
        )
    if loss.numel() != 1 or not torch.is_floating_point(loss):
        raise TypeError(
            f"the {phase} step produced a {loss.dtype} tensor of shape {tuple(loss.shape)}, "
            f"not a scalar loss; {fix}"
        )
    if need_grad and not loss.requires_grad:
        raise ValueError(
            f"the {phase} loss does not depend on any trainable parameter (requires_grad is "
            "False): was it computed under torch.no_grad() or from detached values?"
        )


def describe_batch(batch: Any) -> str:
    """A short description of a batch: types, shapes and dtypes."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, Mapping):
        inner = ", ".join(f"{k}: {describe_batch(v)}" for k, v in list(batch.items())[:6])
        return f"dict({inner})"
    if isinstance(batch, list | tuple):
        inner = ", ".join(describe_batch(v) for v in batch[:6])
        return f"{type(batch).__name__}({inner})"
    return type(batch).__name__


def _host_copy(value: Any, defer: AbstractSet[int] = frozenset()) -> Any:
    """A deep copy with every tensor cloned into host memory, except tensors whose storage
    address is in ``defer``: those stay live, wrapped for ``_finish_host_copy``."""
    if isinstance(value, torch.Tensor):
        if value.numel() and value.untyped_storage().data_ptr() in defer:
            return _Deferred(value.detach())
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v, defer) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_copy(v, defer) for v in value)
    return value


@dataclass(frozen=True)
class _Deferred:
    """A live tensor whose host copy ``_host_copy`` left for later."""

    tensor: torch.Tensor


def _finish_host_copy(value: Any) -> Any:
    """``value`` with every ``_Deferred`` tensor copied into host memory."""
    if isinstance(value, _Deferred):
        return value.tensor.to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _finish_host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_finish_host_copy(v) for v in value)
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
