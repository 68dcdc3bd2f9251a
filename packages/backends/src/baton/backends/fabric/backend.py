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

With ``mean_over=count(batch)`` a step's loss is a mean over the items of the whole
global batch (every micro-batch and rank: supervised tokens, preference pairs) rather
than a mean of per-batch means. The backend draws the step's micro-batches first, counts
their items, sums the count over ranks (one all-reduce) and hands each batch (a dict) to
the loss with that total under ``"num_items_in_batch"`` (``transformers``' own keyword:
its loss is then the batch's sum divided by it). The loss and every other metric the loss
returns are each micro-batch's share of the global mean: the backend adds them over
micro-batches and ranks (one more all-reduce) and scales the backward pass so the
averaged gradient is the gradient of the global mean::

    FabricBackend(model, optimizer, rows, mean_over=lambda b: int((b["labels"] != -100).sum()))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from baton.backends import torch_distributed
from baton.backends.fabric.build import (
    ModelFactory,
    OptimizerFactory,
    build_model,
    is_sharded,
    launch_fabric,
    make_fabric,
    setup_model_and_optimizer,
)
from baton.backends.fabric.changes import LR_SETTINGS, SCHEDULE_SETTINGS, AsBuilt
from baton.backends.fabric.checkpoint import FabricCheckpointIO
from baton.backends.fabric.config import FabricConfig
from baton.backends.fabric.evaluation import evaluate_batches
from baton.backends.fabric.model_state import FabricModelState
from baton.backends.fabric.replay import FabricCorruptionChecks
from baton.backends.fabric.step import BatchError, BatchLoss, StepFn, split_loss
from baton.backends.fabric.stream import LoaderStream, count_batch, shard_stream
from baton.backends.fabric.weights import load_weights
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoint_io import UsesCheckpointIO
from baton.core.launch import Launch
from baton.core.metrics import StepOutput

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]

#: also importable from here (``LightningBackend`` and older code import them so)
__all__ = ["BatchError", "FabricBackend", "FabricConfig", "split_loss"]


class FabricBackend(
    UsesCheckpointIO[FabricCheckpointIO],
    torch_distributed.TorchDistributed,
    FabricModelState,
    BackendBase,
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
        mean_over: ``mean_over(batch) -> int``, the items a step's loss is a mean over
            (see the module docs): the global batch's, handed to the loss under
            ``"num_items_in_batch"``.
        config: a ``FabricConfig``; keyword ``overrides`` set its fields.

    Beside the step it owns its checkpoint I/O (``checkpoints``, ``fabric/checkpoint.py``),
    its corruption checks (``corruption``, ``fabric/replay.py``) and the model-state view
    (``fabric/model_state.py``); evaluation is ``fabric/evaluation.py``, building the
    model and optimizer ``fabric/build.py``.
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
        mean_over: Callable[[Any], int] | None = None,
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
        self.mean_over = mean_over
        self._flops_per_token = flops_per_token
        self._describe = dict(describe or {})
        self.fabric: Any = None
        self.model: Any = None
        self.raw_model: nn.Module | None = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.stream: LoaderStream | None = None
        self._num_params = 0
        self._losses: BatchLoss | None = None
        self._as_built: AsBuilt | None = None
        self.checkpoints = FabricCheckpointIO(self)
        self._corruption: FabricCorruptionChecks | None = None
        #: training samples every rank drew together (the data position core records)
        self.samples_consumed = 0

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
        self.fabric = launch_fabric(self._make_fabric(), join_group=self.init_process_group)
        self._device = self.fabric.device
        if self.config.seed is not None:
            from lightning.fabric.utilities.seed import seed_everything

            seed_everything(self.config.seed, verbose=False)
        sharded = self._sharded()
        self.raw_model = build_model(self.fabric, self.model_source, sharded=sharded)
        self._num_params = sum(p.numel() for p in self.raw_model.parameters())
        if self.config.init_from:
            load_weights(self.raw_model, self.config.init_from)
        self.model, self.optimizer = setup_model_and_optimizer(
            self.fabric, self.raw_model, self.optimizer_source, sharded=sharded
        )
        self.scheduler = (
            self.scheduler_source(self.optimizer) if self.scheduler_source is not None else None
        )
        self.stream = self._make_stream(self._training_data())
        self._as_built = AsBuilt.take(self.optimizer, self._schedulers())

    def _schedulers(self) -> list[Any]:
        """The learning-rate schedulers stepped with the optimizer."""
        return [self.scheduler] if self.scheduler is not None else []

    def _make_fabric(self) -> Any:
        return make_fabric(self.config)

    def _sharded(self) -> bool:
        return is_sharded(self.fabric)

    def _training_data(self) -> Iterable[Any]:
        if self.data is None:
            raise ValueError("FabricBackend needs training data: data=DataLoader(...) or a list")
        return self.data

    def _make_stream(self, data: Iterable[Any]) -> LoaderStream:
        return shard_stream(self.fabric, data, self.config.on_epoch_end)

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        return self.corruption.run_step(self._step)

    def _step(self) -> StepOutput:
        if self.mean_over is not None:
            return self._global_mean_step(self.mean_over)
        assert self.stream is not None and self.optimizer is not None
        fabric, cfg = self.fabric, self.config
        metrics: dict[str, Any] = {"lr": self.optimizer.param_groups[0]["lr"]}
        total: torch.Tensor | None = None
        samples = tokens = 0
        waited = 0.0
        for micro in range(cfg.grad_accum):
            started = time.perf_counter()
            host_batch = self.corruption.draw(self.stream.next)
            waited += time.perf_counter() - started
            batch = fabric.to_device(host_batch)
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
            with fabric.no_backward_sync(self.model, enabled=micro < cfg.grad_accum - 1):
                loss, extra = self._batch_loss().training(self.model, batch)
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

    def _global_mean_step(self, mean_over: Callable[[Any], int]) -> StepOutput:
        """A step whose loss (and metrics) are means over the items of the global batch
        (``mean_over``; see the module docs)."""
        assert self.stream is not None and self.optimizer is not None
        fabric, cfg = self.fabric, self.config
        started = time.perf_counter()
        host_batches = [self.corruption.draw(self.stream.next) for _ in range(cfg.grad_accum)]
        waited = time.perf_counter() - started
        count = torch.tensor(float(sum(mean_over(b) for b in host_batches)), device=self._device)
        if fabric.world_size > 1:
            count = fabric.all_reduce(count, reduce_op="sum")
        count = count.clamp(min=1.0)  # a global batch without items contributes nothing
        shares: dict[str, torch.Tensor] = {}
        samples = tokens = 0
        for micro, host_batch in enumerate(host_batches):
            batch = fabric.to_device(host_batch)
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
            with fabric.no_backward_sync(self.model, enabled=micro < cfg.grad_accum - 1):
                loss, extra = self._batch_loss().training(
                    self.model, {**batch, "num_items_in_batch": count}
                )
                # each share is already divided by the global count; DDP averages the
                # ranks' gradients and the global mean is their sum
                fabric.backward(loss * fabric.world_size if fabric.world_size > 1 else loss)
            for name, value in {"loss": loss, **extra}.items():
                value = torch.as_tensor(value, device=self._device).detach().float()
                shares[name] = value if name not in shares else shares[name] + value
        if fabric.world_size > 1:
            summed = fabric.all_reduce(torch.stack(list(shares.values())), reduce_op="sum")
            shares = dict(zip(shares, summed.unbind(), strict=True))
        metrics: dict[str, Any] = {"lr": self.optimizer.param_groups[0]["lr"]}
        metrics.update({k: v for k, v in shares.items() if k != "loss"})
        self.before_clipping()
        if cfg.grad_clip is not None:
            metrics["grad_norm"] = fabric.clip_gradients(
                self.model, self.optimizer, max_norm=cfg.grad_clip, error_if_nonfinite=False
            )
        self._optimizer_step()
        world = fabric.world_size
        self.samples_consumed += samples * world
        return StepOutput(
            loss=shares["loss"],
            metrics=metrics,
            tokens=tokens * world,
            samples=samples * world,
            data_wait_s=waited,
        )

    def _batch_loss(self) -> BatchLoss:
        """How a batch becomes a loss (``step.BatchLoss``), from ``training_step`` or
        ``loss_fn`` as they are when the first batch comes."""
        if self._losses is None:
            self._losses = BatchLoss(self.training_step, self.loss_fn)
        return self._losses

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

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
        losses, model = self._batch_loss(), self.model
        return evaluate_batches(
            self.fabric,
            model,
            self.eval_data,
            lambda batch: losses.evaluation(model, batch),
            self.config.eval_batches,
        )

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Evaluation, skipping data, several ranks and the model-state view always; an
        asynchronous save where the state is whole (single device, DDP: written by a
        thread); weight checksums and step replay where a rank holds whole replicas."""
        offered = Abilities(
            evaluate=True,
            skip_data=True,
            multi_rank=True,
            model_state=True,
            async_save=self.fabric is not None and self.checkpoints.asynchronous,
            weight_checksums=True,
            step_replay=True,
        )
        if self.fabric is None:
            return offered
        return offered.refusing(**self.corruption.refusals())

    # -- checkpoints: FabricCheckpointIO (checkpoint.py), through UsesCheckpointIO -----
    def teardown(self) -> None:
        """Wait for a save still being written and stop the writer thread; forget what
        was built around this run's model (a next ``setup`` builds it again)."""
        self.checkpoints.close()
        self._corruption = self._losses = None

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

    # -- silent-corruption checks: FabricCorruptionChecks (replay.py) -----------------
    @property
    def corruption(self) -> FabricCorruptionChecks:
        """This run's weight checksums and step replay, built after ``setup``."""
        if self._corruption is None:
            self._corruption = FabricCorruptionChecks(
                self.fabric,
                self.raw_model,
                self.optimizer,
                schedulers=self._schedulers,
                wait_for_staging=self.checkpoints.wait_for_staging,
            )
        return self._corruption

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        return self.corruption.gather_weight_checksums()

    def replay_next_step(self) -> bool:
        return self.corruption.replay_next_step()

    def gather_replay_mismatches(self) -> list[list[str]]:
        return self.corruption.gather_replay_mismatches()
