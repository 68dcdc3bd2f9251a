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

A metric whose weight is not the loss's items (TRL's DPO accuracies over pairs, a
clipped fraction over tokens) is returned as ``step.WeightedMean(total, weight)``: its
totals and weights are added over micro-batches and ranks in that same all-reduce, and
the step logs ``total / weight`` (without ``mean_over``: each micro-batch's mean).

Online RL (an objective that samples rollouts each step, GRPO): ``data`` is
``rollout_rows.RolloutRows``, each step this rank's share of the rollout phase's batch,
and the backend gives the phase its two collectives: ``gather_weights()`` (the model's
weights by Hugging Face name on rank 0: ``gathered_weights.py``) and ``broadcast(value)``
(rank 0's value on every rank)::

    rows = RolloutRows(batch_size=8)
    backend = FabricBackend(model, optimizer, rows, loss_fn=ObjectiveLoss(run),
                            mean_over=ObjectiveItems(run))
    phase = build_rollout_phase(..., gather_weights=backend.gather_weights,
                                broadcast=backend.broadcast)
    rows.read_from(lambda: phase.current)
    Driver(backend, callbacks, rollouts=phase)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from baton.backends.fabric.build import (
    ModelFactory,
    OptimizerFactory,
    build_model,
    setup_model_and_optimizer,
)
from baton.backends.fabric.changes import LR_SETTINGS, SCHEDULE_SETTINGS, AsBuilt
from baton.backends.fabric.checkpoint import FabricCheckpointIO
from baton.backends.fabric.config import FabricConfig
from baton.backends.fabric.evaluation import evaluate_batches
from baton.backends.fabric.fast_paths import FastPaths
from baton.backends.fabric.model_state import FabricModelState
from baton.backends.fabric.replay import FabricCorruptionChecks
from baton.backends.fabric.rollout_rows import RolloutRows, RolloutStream
from baton.backends.fabric.runtime import (
    FabricRuntime,
    ModelFacts,
    TrainingParts,
    UsesFabricRuntime,
)
from baton.backends.fabric.step import (
    BatchError,
    BatchLoss,
    GlobalItemMean,
    MicroBatchMean,
    StepFn,
    TimedDraws,
    split_loss,
)
from baton.backends.fabric.stream import DataPosition, TrainingStream, count_batch, shard_stream
from baton.backends.fabric.weights import load_weights
from baton.backends.torch_model_state import TorchModelState
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.cli.overrides import set_fields
from baton.core.metrics import StepOutput

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]

log = logging.getLogger("baton")

#: why a backend without evaluation data cannot evaluate, and the fix
NO_EVAL_DATA = (
    "no evaluation data: hold some out with --eval-split F or give --eval-data-path "
    "(FabricBackend(eval_data=...)), or run with --eval-every 0"
)

#: also importable from here (``LightningBackend`` and older code import them so)
__all__ = ["BatchError", "FabricBackend", "FabricConfig", "split_loss"]


class FabricBackend(UsesCheckpointIO[FabricCheckpointIO], UsesFabricRuntime, BackendBase):
    """Any PyTorch model, optimizer and data through lightning.fabric.Fabric (DDP/FSDP, precision).

    Args:
        model: an ``nn.Module``, or a factory returning one (built inside
            ``fabric.init_module`` so FSDP can build it sharded).
        optimizer: ``optimizer(model) -> Optimizer`` called with the set-up model.
        data: the training batches: any ``DataLoader`` (torchdata's ``StatefulDataLoader``
            for an exact data position on resume) or re-iterable of batches; or
            ``RolloutRows``, each step's rollouts (see the module docs).
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
        fast_paths: the fast paths of a ``transformers`` model (``fast_paths.FastPaths``):
            ``setup`` compiles its decoder layers when asked, before Fabric wraps it, and
            logs the one line saying which paths run.
        config: a ``FabricConfig``; keyword ``overrides`` set its fields.

    Beside the step it owns its Fabric runtime (``runtime``, ``fabric/runtime.py``: the
    launched Fabric, device and ranks), what ``setup`` built (``parts``, a
    ``TrainingParts``), the data position (``position``), and the parts handed those:
    its checkpoint I/O (``checkpoints``, ``fabric/checkpoint.py``), its corruption checks
    (``corruption``, ``fabric/replay.py``) and the model-state view (``model_view``,
    ``fabric/model_state.py``); evaluation is ``fabric/evaluation.py``, building the
    model and optimizer ``fabric/build.py``.
    """

    name = "fabric"
    distribution = "lightning"

    def __init__(
        self,
        model: nn.Module | ModelFactory | None = None,
        optimizer: OptimizerFactory | torch.optim.Optimizer | None = None,
        data: Iterable[Any] | RolloutRows | None = None,
        *,
        loss_fn: StepFn | None = None,
        training_step: StepFn | None = None,
        scheduler: SchedulerFactory | None = None,
        eval_data: Iterable[Any] | None = None,
        count_tokens: Callable[[Any], int] | None = None,
        flops_per_token: float | None = None,
        describe: Mapping[str, Any] | None = None,
        mean_over: Callable[[Any], int] | None = None,
        fast_paths: FastPaths | None = None,
        config: FabricConfig | None = None,
        **overrides: Any,
    ) -> None:
        self.config = config or FabricConfig()
        set_fields(self.config, overrides)
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
        self.fast_paths = fast_paths
        #: FLOPs per token and the facts checkpoints record (the parameters counted in setup)
        self.facts = ModelFacts(flops_per_token, dict(describe or {}))
        self._losses: BatchLoss | None = None
        self._as_built: AsBuilt | None = None
        self._corruption: FabricCorruptionChecks | None = None
        #: the launched Fabric, its device and ranks
        self.runtime = FabricRuntime()
        #: the model, optimizer and scheduler ``setup`` built (``None`` before)
        self.parts: TrainingParts | None = None
        #: the training stream and the samples every rank drew together
        self.position = DataPosition()
        self.checkpoints = FabricCheckpointIO(self.runtime, lambda: self.parts, self.position)
        self.model_view = FabricModelState(
            lambda: self.parts, lambda: self.runtime.rank, self.runtime.fetch
        )

    # -- what setup built, by name ----------------------------------------------------
    @property
    def fabric(self) -> Any:
        """The launched ``lightning.fabric.Fabric`` (``None`` before ``setup``)."""
        return self.runtime.fabric

    @property
    def raw_model(self) -> nn.Module | None:
        """The user's module (``None`` before ``setup``)."""
        return self.parts.raw_model if self.parts is not None else None

    @property
    def model(self) -> Any:
        """The module as Fabric set it up (``None`` before ``setup``)."""
        return self.parts.model if self.parts is not None else None

    @property
    def optimizer(self) -> Any:
        """The optimizer as Fabric set it up (``None`` before ``setup``)."""
        return self.parts.optimizer if self.parts is not None else None

    @property
    def scheduler(self) -> Any:
        """The learning-rate scheduler, if there is one."""
        return (
            self.parts.schedulers[0] if self.parts is not None and self.parts.schedulers else None
        )

    @property
    def stream(self) -> TrainingStream | None:
        """This rank's training stream (``None`` before ``setup``)."""
        return self.position.stream

    @property
    def samples_consumed(self) -> int:
        """Training samples every rank drew together (the data position core records)."""
        return self.position.samples

    # -- facts ----------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float | None:
        return self.facts.flops_per_token

    def describe(self) -> dict[str, Any]:
        return self.facts.describe(self.raw_model)

    # -- build ------------------------------------------------------------------------
    def setup(self) -> None:
        self.config.check()
        fabric = self.runtime.launch(self.config)
        if self.config.seed is not None:
            from lightning.fabric.utilities.seed import seed_everything

            seed_everything(self.config.seed, verbose=False)
        sharded = self.runtime.sharded
        raw_model = build_model(fabric, self.model_source, sharded=sharded)
        self.facts.parameters = sum(p.numel() for p in raw_model.parameters())
        if self.config.init_from:
            load_weights(raw_model, self.config.init_from)
        if self.fast_paths is not None:  # compiled in place: the module keeps its names
            self.fast_paths.prepare(raw_model)
            log.info(self.fast_paths.describe())
        model, optimizer = setup_model_and_optimizer(
            fabric, raw_model, self.optimizer_source, sharded=sharded
        )
        scheduler = self.scheduler_source(optimizer) if self.scheduler_source is not None else None
        schedulers = (scheduler,) if scheduler is not None else ()
        self.parts = TrainingParts(raw_model, model, (optimizer,), schedulers)
        self.position.stream = self._stream_of(fabric, self._training_data())
        self._as_built = AsBuilt.take(optimizer, schedulers)

    def _training_data(self) -> Iterable[Any] | RolloutRows:
        if self.data is None:
            raise ValueError("FabricBackend needs training data: data=DataLoader(...) or a list")
        return self.data

    def _stream_of(self, fabric: Any, data: Iterable[Any] | RolloutRows) -> TrainingStream:
        """This rank's stream of the training data: its share of each step's rollouts
        (``RolloutRows``), else batches of the user's iterable (``shard_stream``)."""
        if isinstance(data, RolloutRows):
            return data.shard(fabric.global_rank, fabric.world_size, self.config.grad_accum)
        return shard_stream(fabric, data, self.config.on_epoch_end)

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        return self.corruption.run_step(self._step)

    def _step(self) -> StepOutput:
        """One optimizer step over ``grad_accum`` micro-batches, drawn as the loop reaches
        each; with ``mean_over`` all drawn first and counted, and the loss a mean over the
        global batch's items (see the module docs)."""
        parts, stream = self._built()
        model, optimizer = parts.model, parts.optimizer
        fabric, cfg = self.runtime.fabric, self.config
        lr = optimizer.param_groups[0]["lr"]
        draws = TimedDraws(lambda: self.corruption.draw(stream.next), cfg.grad_accum)
        batches: Iterable[Any] = draws
        mean: MicroBatchMean | GlobalItemMean = MicroBatchMean(cfg.grad_accum)
        if self.mean_over is not None:
            batches = list(draws)  # counted before any is trained on
            mean = GlobalItemMean.counted(batches, self.mean_over, fabric, self.runtime.device)
        samples = tokens = 0
        for micro, host_batch in enumerate(batches):
            batch = fabric.to_device(host_batch)
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
            with fabric.no_backward_sync(model, enabled=micro < cfg.grad_accum - 1):
                loss, extra = self._batch_loss().training(model, mean.inputs(batch))
                fabric.backward(mean.backward_of(loss))
            mean.add(loss, extra)
        loss, values = mean.result(fabric)
        metrics: dict[str, Any] = {"lr": lr, **values}
        self.model_view.before_clipping()
        if cfg.grad_clip is not None:
            # error_if_nonfinite=False: checking would sync with the device every step;
            # a non-finite loss or norm is the LossGuard callback's job, on log steps.
            metrics["grad_norm"] = fabric.clip_gradients(
                model, optimizer, max_norm=cfg.grad_clip, error_if_nonfinite=False
            )
        self._optimizer_step(parts)
        world = fabric.world_size
        self.position.samples += samples * world
        return StepOutput(
            loss=loss,
            metrics=metrics,
            tokens=tokens * world,
            samples=samples * world,
            data_wait_s=draws.waited_s,
        )

    def _batch_loss(self) -> BatchLoss:
        """How a batch becomes a loss (``step.BatchLoss``), from ``training_step`` or
        ``loss_fn`` as they are when the first batch comes."""
        if self._losses is None:
            self._losses = BatchLoss(self.training_step, self.loss_fn)
        return self._losses

    def _built(self) -> tuple[TrainingParts, TrainingStream]:
        """What ``setup`` built: the parts and the training stream."""
        assert self.parts is not None and self.position.stream is not None
        return self.parts, self.position.stream

    @staticmethod
    def _optimizer_step(parts: TrainingParts) -> None:
        parts.optimizer.step()
        for scheduler in parts.schedulers:
            scheduler.step()
        parts.optimizer.zero_grad(set_to_none=True)

    def skip_data(self, steps: int) -> None:
        """Draw and discard ``steps`` optimizer steps' worth of batches (rollouts have
        none to skip: ``rollout_rows.RolloutStream.skip``)."""
        stream = self._built()[1]
        if isinstance(stream, RolloutStream):
            stream.skip(steps)
            return
        for _ in range(steps * self.config.grad_accum):
            stream.next()

    # -- online RL: the rollout phase's collectives ------------------------------------
    def gather_weights(self) -> dict[str, torch.Tensor] | None:
        """The model's current weights as whole tensors by their Hugging Face names (the
        names and tensors ``baton export`` writes) on global rank 0, ``None`` on the other
        ranks; gathered over FSDP's shards (``gathered_weights.py``). A collective under
        a sharded strategy: every rank calls it."""
        from baton.backends.fabric.gathered_weights import gather_hf_weights

        parts = self._built()[0]
        return gather_hf_weights(parts, sharded=self.runtime.sharded, rank=self.runtime.rank)

    def broadcast(self, value: Any) -> Any:
        """Global rank 0's ``value`` on every rank (a collective, through Fabric)."""
        from baton.backends.fabric.gathered_weights import broadcast_object

        return broadcast_object(self.runtime.fabric, value)

    # -- evaluation -------------------------------------------------------------------
    def evaluate(self) -> Mapping[str, Any]:
        """The mean loss (and other metrics a step function returns) over the evaluation
        data, averaged over ranks."""
        if self.eval_data is None:
            raise ValueError(NO_EVAL_DATA)
        losses, model = self._batch_loss(), self._built()[0].model
        return evaluate_batches(
            self.runtime.fabric,
            model,
            self.eval_data,
            lambda batch: losses.evaluation(model, batch),
            self.config.eval_batches,
            weight_of=self.mean_over,  # post-training: a mean over every held-out item
        )

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Evaluation, skipping data, several ranks and the model-state view always; an
        asynchronous save where the state is whole (single device, DDP: written by a
        thread); weight checksums and step replay where a rank holds whole replicas."""
        offered = Abilities(
            evaluate=self.eval_data is not None,
            skip_data=True,
            multi_rank=True,
            model_state=True,
            async_save=self.runtime.fabric is not None and self.checkpoints.asynchronous,
            weight_checksums=True,
            step_replay=True,
        )
        offered = offered.refusing(evaluate=None if self.eval_data is not None else NO_EVAL_DATA)
        if self.runtime.fabric is None:
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
        parts = self._built()[0]
        return self._as_built.reapply(parts.optimizer, parts.schedulers, changes)

    # -- silent-corruption checks: FabricCorruptionChecks (replay.py) -----------------
    @property
    def corruption(self) -> FabricCorruptionChecks:
        """This run's weight checksums and step replay, built after ``setup``."""
        if self._corruption is None:
            self._corruption = FabricCorruptionChecks.of(
                self.runtime, self._built()[0], self.checkpoints.wait_for_staging
            )
        return self._corruption

    # -- model state: FabricModelState (model_state.py) ---------------------------------
    def model_state(self) -> TorchModelState:
        """The run's ``ModelState`` (after ``setup``), built on first use."""
        return self.model_view.view()

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        return self.corruption.gather_weight_checksums()

    def replay_next_step(self) -> bool:
        return self.corruption.replay_next_step()

    def gather_replay_mismatches(self) -> list[list[str]]:
        return self.corruption.gather_replay_mismatches()
