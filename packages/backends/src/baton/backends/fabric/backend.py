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

The loss of a step is, in this order: ``training_step(model, batch)``,
``loss_fn(model, batch)``, or what the model returns for the batch (``model(**batch)``
for a dict, ``model(*batch)`` for a tuple, else ``model(batch)``). Each may return a
scalar tensor, an object with ``.loss`` (Hugging Face outputs), a dict with ``"loss"``
and other metrics, or ``(loss, {name: value})``: the other scalar metrics are logged
under their own names beside ``loss`` (and averaged over evaluation batches).
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from baton.backends import torch_distributed
from baton.backends.fabric.changes import LR_SETTINGS, SCHEDULE_SETTINGS, AsBuilt
from baton.backends.fabric.checkpoint import (
    FabricCheckpointIO,
    own_rank_state,
    restore_rng_state,
    rng_state,
    with_every_rank,
)
from baton.backends.fabric.config import FabricConfig, fabric_arguments
from baton.backends.fabric.model_state import FabricModelState
from baton.backends.fabric.replay import FabricCorruptionChecks, StepReplay
from baton.backends.fabric.step import (
    BatchError,
    call_model,
    check_loss,
    describe_batch,
    split_loss,
)
from baton.backends.fabric.stream import LoaderStream, count_batch, shard_stream
from baton.backends.fabric.weights import load_weights
from baton.core.backend import BackendBase, PendingSave
from baton.core.checkpoint_record import CheckpointFacts
from baton.core.launch import Launch
from baton.core.metrics import StepOutput

ModelFactory = Callable[[], nn.Module]
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
StepFn = Callable[[nn.Module, Any], Any]

#: also importable from here (``LightningBackend`` and older code import them so)
__all__ = ["BatchError", "FabricBackend", "FabricConfig", "split_loss"]


def _destroy_process_group() -> None:
    """Destroy the default process group if it still exists (at interpreter exit)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class FabricBackend(
    torch_distributed.TorchDistributed, FabricModelState, FabricCorruptionChecks, BackendBase
):
    """Any PyTorch model, optimizer and data through lightning.fabric.Fabric (DDP/FSDP, precision).

    Args:
        model: an ``nn.Module``, or a factory returning one (built inside
            ``fabric.init_module`` so FSDP can build it sharded).
        optimizer: ``optimizer(model) -> Optimizer`` called with the set-up model.
        data: the training batches: any ``DataLoader`` (torchdata's ``StatefulDataLoader``
            for an exact data position on resume) or re-iterable of batches.
        loss_fn: ``loss_fn(model, batch) -> loss`` (see the module docs).
        training_step: ``training_step(model, batch)`` instead of ``loss_fn``: a loss or a
            dict with ``loss`` and other metrics (see the module docs).
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
        self.stream: LoaderStream | None = None
        self._num_params = 0
        self._checked = False
        self._as_built: AsBuilt | None = None
        self._checkpoints: FabricCheckpointIO | None = None
        #: training samples every rank drew together (the data position core records)
        self.samples_consumed = 0
        self.replay = StepReplay()

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
        return self._fabric_class()(**fabric_arguments(self.config, Launch.from_env()))

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

    def _make_stream(self, data: Iterable[Any]) -> LoaderStream:
        return shard_stream(self.fabric, data, self.config.on_epoch_end, self._epoch_ended)

    def _epoch_ended(self, epoch: int) -> None:
        """Called when epoch ``epoch`` of the training data is used up."""

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        self.steps_run += 1
        return self._replayed_step(self._step) if self.replay.armed else self._step()

    def _step(self) -> StepOutput:
        assert self.stream is not None and self.optimizer is not None
        fabric, cfg = self.fabric, self.config
        metrics: dict[str, Any] = {"lr": self.optimizer.param_groups[0]["lr"]}
        total: torch.Tensor | None = None
        samples = tokens = 0
        waited = 0.0
        for micro in range(cfg.grad_accum):
            started = time.perf_counter()
            host_batch = self.replay.draw(self.stream.next)
            waited += time.perf_counter() - started
            batch = fabric.to_device(host_batch)
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
            with fabric.no_backward_sync(self.model, enabled=micro < cfg.grad_accum - 1):
                loss, extra = self._loss(batch, micro)
                fabric.backward(loss if cfg.grad_accum == 1 else loss / cfg.grad_accum)
            total = loss.detach() if total is None else total + loss.detach()
            metrics.update(extra)
        assert total is not None
        self.before_clipping()
        if cfg.grad_clip is not None:
            # error_if_nonfinite=False: checking would sync with the device every step;
            # a non-finite loss or norm is the LossGuard callback's job, on log steps.
            metrics["grad_norm"] = fabric.clip_gradients(
                self.model, self.optimizer, max_norm=cfg.grad_clip, error_if_nonfinite=False
            )
        self._optimizer_step()
        world = fabric.world_size
        self.samples_consumed += samples * world
        return StepOutput(
            loss=total if cfg.grad_accum == 1 else total / cfg.grad_accum,
            metrics=metrics,
            tokens=tokens * world,
            samples=samples * world,
            data_wait_s=waited,
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
            return split_loss(self.loss_fn(self.model, batch))
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
        own = {
            "data": self.stream.state_dict(),
            "rng": rng_state(self.fabric.device),
            "samples": self.samples_consumed,
        }
        return with_every_rank(own, self.fabric.world_size)  # fabric.save writes rank 0's

    def _load_extra_state(self, remainder: dict[str, Any]) -> None:
        assert self.stream is not None
        own = own_rank_state(remainder, self.fabric.global_rank, self.fabric.world_size)
        self.stream.load_state_dict(own["data"])
        self.samples_consumed = int(own.get("samples", 0))
        restore_rng_state(own["rng"], self.fabric.device)

    @property
    def checkpoints(self) -> FabricCheckpointIO:
        """This run's checkpoint I/O (``fabric/checkpoint.py``), built after ``setup``."""
        if self._checkpoints is None:
            self._checkpoints = FabricCheckpointIO(
                self.fabric, self.model, self.optimizer, self.raw_model
            )
        return self._checkpoints

    @property
    def supports_async_save(self) -> bool:
        """Whole states (single device, DDP) are written by a thread; sharded ones not."""
        return self.checkpoints.asynchronous

    def save(self, directory: Path, *, asynchronous: bool = False) -> PendingSave | None:
        state = {**self._state(), **self._extra_state()}
        return self.checkpoints.save(Path(directory), state, asynchronous=asynchronous)

    def _wait_for_staging(self) -> None:
        """Block until an asynchronous save has copied the weights and optimizer state."""
        if self._checkpoints is not None:
            self._checkpoints.wait_for_staging()

    def load(self, directory: Path) -> None:
        self._load_extra_state(self.checkpoints.load(Path(directory), self._state()))

    def checkpoint_facts(self) -> CheckpointFacts:
        return self.checkpoints.facts(self.samples_consumed)

    def layout_refusal(self, saved: Mapping[str, Any]) -> str | None:
        return self.checkpoints.layout_refusal(saved, self.checkpoint_facts().layout)

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        """None: Fabric checkpoints never had a side file of facts."""
        return None

    def teardown(self) -> None:
        """Wait for a save still being written and stop the writer thread."""
        if self._checkpoints is not None:
            self._checkpoints.close()
            self._checkpoints = None

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
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
