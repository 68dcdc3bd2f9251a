"""An existing ``LightningModule`` (and ``LightningDataModule``), unchanged, under baton.

``LightningBackend`` runs what ``lightning.pytorch.Trainer.fit`` runs, one optimizer step
at a time through Fabric, with the Trainer's loop semantics (``loop``): the
module's and datamodule's data and setup hooks, ``configure_optimizers`` with scheduler
``interval``/``frequency``/``monitor`` (``ReduceLROnPlateau``), automatic optimization
with accumulation windows that close at each epoch's end, manual optimization with any
number of optimizers (``manual``), the training and validation hooks, a sanity
check, validation in the global random state, and ``self.log`` through Lightning's own
result collection. ``self.trainer`` is a ``TrainerView`` (``trainer``).

Trainer settings live in ``FabricConfig`` (``grad_clip`` is ``gradient_clip_val``,
``grad_accum`` is ``accumulate_grad_batches``, ``precision``, ``strategy``, ``eval_batches``
is ``limit_val_batches``) and in the backend's own arguments (``max_steps``,
``max_epochs``, ``num_sanity_val_steps``, Lightning ``callbacks``); the driver's
``eval_every`` is ``val_check_interval`` in optimizer steps. A hook the module overrides
that baton does not call is an error listing them all, never silently skipped.

Example::

    from baton.backends.fabric import FabricConfig
    from baton.backends.lightning import LightningBackend
    from baton.core import Driver

    backend = LightningBackend(LitModel(), datamodule=MNISTDataModule(), max_epochs=10,
                               config=FabricConfig(grad_clip=1.0))
    Driver(backend, max_steps=1000, eval_every=200, run_dir="runs/lit").fit()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.backends.fabric.changes import SCHEDULE_SETTINGS, AsBuilt
from baton.backends.fabric.checkpoint import FabricCheckpointIO
from baton.backends.fabric.config import FabricConfig
from baton.backends.fabric.model_state import FabricModelState
from baton.backends.fabric.replay import FabricCorruptionChecks
from baton.backends.fabric.runtime import (
    FabricRuntime,
    ModelFacts,
    TrainingParts,
    UsesFabricRuntime,
)
from baton.backends.fabric.stream import DataPosition, count_batch, shard_stream
from baton.backends.lightning.checkpoint_io import (
    FORMER_NAME,
    LightningCheckpointValues,
    holds_loop_state,
    lightning_state,
)
from baton.backends.lightning.loop import LightningLoop
from baton.backends.lightning.manual import check_manual
from baton.backends.lightning.stream import EpochStream
from baton.backends.lightning.validation import overrides
from baton.backends.torch_model_state import TorchModelState
from baton.core.abilities import Abilities
from baton.core.backend import BackendBase, RunLimits
from baton.core.checkpoints.io import UsesCheckpointIO
from baton.core.cli.overrides import set_fields
from baton.core.metrics import NamedMetrics, StepOutput

#: hooks of LightningModule / LightningDataModule that baton calls during a run
HONOURED = frozenset(
    {
        "prepare_data",
        "setup",
        "configure_model",
        "configure_optimizers",
        "train_dataloader",
        "val_dataloader",
        "training_step",
        "validation_step",
        "on_fit_start",
        "on_fit_end",
        "on_train_start",
        "on_train_end",
        "on_train_epoch_start",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_validation_start",
        "on_validation_epoch_start",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_validation_epoch_end",
        "on_validation_end",
        "on_validation_model_eval",
        "on_validation_model_train",
        "on_validation_model_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "optimizer_zero_grad",
        "optimizer_step",
        "configure_gradient_clipping",
        "lr_scheduler_step",
        "on_save_checkpoint",
        "on_load_checkpoint",
        "state_dict",
        "load_state_dict",
        "teardown",
    }
)
#: hooks that belong to other stages than fitting (``Trainer.fit`` does not call them either)
OTHER_STAGES = ("test", "predict")


class LightningHookError(TypeError):
    """The module overrides hooks baton cannot honour; the message lists them."""


def unhonoured_hooks(obj: Any) -> list[str]:
    """Hooks of ``obj`` (a LightningModule or LightningDataModule) overridden by its class
    that baton does not call: they would be silently skipped."""
    import lightning.pytorch as pl
    from lightning.pytorch.core.hooks import CheckpointHooks, DataHooks, ModelHooks

    base: type = (
        pl.LightningModule if isinstance(obj, pl.LightningModule) else pl.LightningDataModule
    )
    names = {
        name
        for hooks in (ModelHooks, DataHooks, CheckpointHooks)
        for name in vars(hooks)
        if not name.startswith("_")
    }
    if base is pl.LightningModule:
        names |= {
            "optimizer_step",
            "optimizer_zero_grad",
            "lr_scheduler_step",
            "configure_gradient_clipping",
            "configure_callbacks",
            "backward",
        }
    found = []
    for name in sorted(names - HONOURED):
        if any(stage in name for stage in OTHER_STAGES) or not hasattr(base, name):
            continue
        if getattr(type(obj), name, None) is not getattr(base, name):
            found.append(name)
    return found


class LightningBackend(UsesCheckpointIO[FabricCheckpointIO], UsesFabricRuntime, BackendBase):
    """A ``lightning.pytorch.LightningModule`` (+ optional ``LightningDataModule``) through Fabric.

    Args:
        module: the LightningModule, as written for ``Trainer.fit``.
        datamodule: its data, if not the module's own ``train_dataloader``.
        config: Fabric and loop settings (gradient clipping, accumulation, precision...).
        callbacks: ``lightning.pytorch.Callback`` objects, run at the Trainer's points.
        max_steps / max_epochs: the run's length as ``Trainer(max_steps=, max_epochs=)``
            states it (``self.trainer.estimated_stepping_batches``); ``max_epochs`` also
            ends the run when that many epochs are done. Without either, the driver's
            ``max_steps`` is the Trainer's (``Driver(max_steps=1000)`` is enough); under
            manual optimization, where one batch may step several optimizers, give
            ``max_steps`` in the Trainer's optimizer steps.
        num_sanity_val_steps: validation batches run before training (``Trainer``'s
            default 2; 0 turns the sanity check off).
        count_tokens / flops_per_token / describe: as for ``FabricBackend``.

    Validation values keep the names the module logged them under (``val_loss``, not
    ``eval/val_loss``): ``EarlyStopping("val_loss")`` and ``Checkpoint(monitor="val_loss")``
    read them in the evaluation phase.

    It composes what the Fabric backend composes (``fabric/runtime.py``'s
    ``FabricRuntime``, ``TrainingParts`` and ``DataPosition``; ``FabricCheckpointIO``,
    ``FabricModelState``, ``FabricCorruptionChecks``) around its own ``LightningLoop``
    (``loop``); its checkpoints add what ``checkpoint_io.py`` names.
    """

    name = "lightning"
    distribution = "lightning"
    #: evaluate() returns the module's own names (``baton.core.NamedMetrics``)
    names_evaluation_metrics = True

    def __init__(
        self,
        module: Any,
        datamodule: Any = None,
        *,
        config: FabricConfig | None = None,
        callbacks: Sequence[Any] = (),
        max_steps: int | None = None,
        max_epochs: int | None = None,
        num_sanity_val_steps: int = 2,
        count_tokens: Any = None,
        flops_per_token: float | None = None,
        describe: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        import lightning.pytorch as pl

        if not isinstance(module, pl.LightningModule):
            raise TypeError(
                f"LightningBackend takes a LightningModule, got {type(module).__name__}"
            )
        if datamodule is not None and not isinstance(datamodule, pl.LightningDataModule):
            raise TypeError(f"datamodule must be a LightningDataModule, got {type(datamodule)}")
        problems = [f"{type(module).__name__}.{h}" for h in unhonoured_hooks(module)]
        if datamodule is not None:
            problems += [f"{type(datamodule).__name__}.{h}" for h in unhonoured_hooks(datamodule)]
        if problems:
            raise LightningHookError(
                "baton cannot honour these overridden Lightning hooks (they would be "
                f"silently skipped): {', '.join(problems)}. baton calls: "
                f"{', '.join(sorted(HONOURED))}. Move their work into a baton callback "
                "or into training_step, or train with lightning.pytorch.Trainer"
            )
        self.config = config or FabricConfig()
        set_fields(self.config, overrides)
        self.module = module
        self.datamodule = datamodule
        self.count_tokens = count_tokens
        #: FLOPs per token and the facts checkpoints record (the parameters counted in setup)
        self.facts = ModelFacts(flops_per_token, dict(describe or {}))
        self._as_built: AsBuilt | None = None
        self._corruption: FabricCorruptionChecks | None = None
        #: the launched Fabric, its device and ranks
        self.runtime = FabricRuntime()
        #: the module, optimizers and schedulers ``setup`` built (``None`` before)
        self.parts: TrainingParts | None = None
        #: the training stream (also ``loop.stream``) and the samples drawn
        self.position = DataPosition()
        self.model_view = FabricModelState(
            lambda: self.parts, lambda: self.runtime.rank, self.runtime.fetch
        )
        #: the run's length was given here (else the driver's ``max_steps`` is used)
        self._length_given = max_steps is not None or max_epochs is not None
        self.loop = LightningLoop(
            self.runtime,
            module,
            datamodule,
            self.config,
            self.model_view.before_clipping,
            callbacks=check_callbacks(callbacks),
            max_steps=max_steps,
            max_epochs=max_epochs,
            num_sanity_val_steps=num_sanity_val_steps,
        )
        self.checkpoints = FabricCheckpointIO(
            self.runtime,
            lambda: self.parts,
            self.position,
            names=lightning_state,
            extras=LightningCheckpointValues(self.loop, module, datamodule),
        )

    # -- what setup built, by name ----------------------------------------------------
    @property
    def fabric(self) -> Any:
        """The launched ``lightning.fabric.Fabric`` (``None`` before ``setup``)."""
        return self.runtime.fabric

    @property
    def raw_model(self) -> Any:
        """The LightningModule once ``setup`` built it (``None`` before)."""
        return self.parts.raw_model if self.parts is not None else None

    @property
    def model(self) -> Any:
        """The module as Fabric set it up (``None`` before ``setup``)."""
        return self.loop.model

    @property
    def optimizer(self) -> Any:
        """The first optimizer ``configure_optimizers`` returned, as Fabric set it up."""
        return self.parts.optimizer if self.parts is not None else None

    @property
    def stream(self) -> EpochStream | None:
        return self.loop.stream

    @property
    def eval_data(self) -> Any:
        """The validation batches (the data hooks' ``val_dataloader``, after ``setup``)."""
        return self.loop.eval_data

    @property
    def scheduler_configs(self) -> list[Any]:
        return self.loop.scheduler_configs

    # -- facts ----------------------------------------------------------------------
    @property
    def flops_per_token(self) -> float | None:
        return self.facts.flops_per_token

    def describe(self) -> dict[str, Any]:
        return self.facts.describe(self.parts.raw_model if self.parts is not None else None)

    # -- build ------------------------------------------------------------------------
    def setup(self) -> None:
        self.config.check()
        if not self.module.automatic_optimization:
            check_manual(self.config)
        fabric = self.runtime.launch(self.config, join_baton_group=False)
        from lightning.fabric.strategies import ParallelStrategy
        from lightning.fabric.utilities.seed import reset_seed, seed_everything

        if self.config.seed is not None:
            seed_everything(self.config.seed, verbose=False)
        elif isinstance(fabric.strategy, ParallelStrategy):
            reset_seed()  # as the Trainer's parallel strategies do when they set up
        module, loop = self.module, self.loop
        module.trainer = loop.trainer
        data_hooks = self.datamodule if self.datamodule is not None else module
        if self.datamodule is not None:
            self.datamodule.trainer = loop.trainer
        if fabric.local_rank == 0:
            if self.datamodule is not None:
                self.datamodule.prepare_data()
            module.prepare_data()
        fabric.barrier()
        for callback in loop.callbacks:
            callback.setup(loop.trainer, module, "fit")
        if self.datamodule is not None:
            self.datamodule.setup("fit")
        module.setup("fit")
        with fabric.init_module(empty_init=self.runtime.sharded):
            module.configure_model()
        self.facts.parameters = sum(p.numel() for p in module.parameters())
        if self.config.init_from:
            from baton.backends.fabric.weights import load_weights

            load_weights(module, self.config.init_from)
        loop.model = fabric.setup_module(module)
        module._fabric = None  # self.trainer, self.log, self.optimizers(): baton's TrainerView
        self.position.stream = loop.stream = EpochStream(
            self._loader(data_hooks.train_dataloader())
        )
        if loop.eval_data is None and overrides(module, "validation_step"):
            loop.eval_data = self._loader(data_hooks.val_dataloader())
        self._setup_optimizers()
        schedulers = tuple(config.scheduler for config in loop.scheduler_configs)
        self.parts = TrainingParts(module, loop.model, tuple(loop.optimizers), schedulers)
        self._as_built = AsBuilt.take(self.parts.optimizer, schedulers)

    def _loader(self, data: Any) -> Any:
        """Each rank's shard of the training data (a DistributedSampler) with several ranks."""
        return shard_stream(self.runtime.fabric, data, self.config.on_epoch_end).data

    def _setup_optimizers(self) -> None:
        from lightning.pytorch.core.optimizer import (
            LightningOptimizer,
            _configure_optimizers,
            _configure_schedulers_automatic_opt,
            _configure_schedulers_manual_opt,
        )

        loop = self.loop
        returned = loop.module_hook("configure_optimizers")
        optimizers, schedulers, monitor = _configure_optimizers(returned)
        if not self.module.automatic_optimization:
            loop.scheduler_configs = _configure_schedulers_manual_opt(schedulers)
        elif len(optimizers) != 1:
            raise LightningHookError(
                f"configure_optimizers returned {len(optimizers)} optimizers; automatic "
                "optimization steps exactly one (set self.automatic_optimization = False "
                "and step them in training_step)"
            )
        else:
            loop.scheduler_configs = _configure_schedulers_automatic_opt(schedulers, monitor)
        loop.optimizers = [self.runtime.fabric.setup_optimizers(opt) for opt in optimizers]
        loop.lightning_optimizers = [
            LightningOptimizer._to_lightning_optimizer(opt, loop.trainer.strategy)  # type: ignore[arg-type]
            for opt in loop.optimizers
        ]

    # -- abilities --------------------------------------------------------------------
    def abilities(self) -> Abilities:
        """Evaluation, several ranks and the model-state view always; an asynchronous
        save where the state is whole (single device, DDP); weight checksums where a rank
        holds whole replicas. Refused: skipping data (``Trainer.fit`` has no step that
        reads batches without training on them) and step replay (Lightning's loop draws
        the batches and runs the step itself)."""
        offered = Abilities(
            evaluate=True,
            skip_data=True,
            multi_rank=True,
            model_state=True,
            async_save=self.runtime.fabric is not None and self.checkpoints.asynchronous,
            weight_checksums=True,
            step_replay=True,
        )
        if self.runtime.fabric is not None:
            offered = offered.refusing(**self.corruption.refusals())
        return offered.refusing(
            skip_data="Trainer.fit has no step that reads batches without training on "
            "them; use FabricBackend to skip data",
            step_replay="a LightningModule's step runs in Lightning's own loop, which "
            "baton cannot run twice on the same batches; use FabricBackend to replay steps",
        )

    @property
    def corruption(self) -> FabricCorruptionChecks:
        """This run's weight checksums, built after ``setup``."""
        if self._corruption is None:
            assert self.parts is not None, "the corruption checks are built after setup"
            self._corruption = FabricCorruptionChecks.of(
                self.runtime, self.parts, self.checkpoints.wait_for_staging
            )
        return self._corruption

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        return self.corruption.gather_weight_checksums()

    def model_state(self) -> TorchModelState:
        """The run's ``ModelState`` (after ``setup``), built on first use."""
        return self.model_view.view()

    # -- the step ---------------------------------------------------------------------
    def train_step(self, step: int) -> StepOutput:
        loss, metrics = self.loop.train_step()
        assert self.parts is not None
        metrics.setdefault("lr", self.parts.optimizer.param_groups[0]["lr"])
        samples = tokens = 0
        for batch in self.loop.step_batches:
            n_samples, n_tokens = count_batch(batch)
            samples += n_samples
            tokens += self.count_tokens(batch) if self.count_tokens is not None else n_tokens
        world = self.runtime.fabric.world_size
        assert self.loop.stream is not None
        return StepOutput(
            loss=loss,
            metrics=metrics,
            tokens=tokens * world,
            samples=samples * world,
            data_wait_s=self.loop.stream.take_wait(),
        )

    def use_run_limits(self, limits: RunLimits) -> None:
        """The driver's limits (before ``setup``): with neither ``max_steps`` nor
        ``max_epochs`` given here, the driver's ``max_steps`` is ``Trainer(max_steps=)``
        (one batch is one optimizer step under automatic optimization)."""
        if self._length_given or not self.module.automatic_optimization:
            return
        self.loop.max_steps = limits.max_steps

    # -- evaluation -------------------------------------------------------------------
    def use_run_dir(self, run_dir: Path) -> None:
        """The driver's run directory (before ``setup``): ``self.trainer.log_dir`` is
        ``<run_dir>/logs`` and ``default_root_dir`` the run directory, where baton's
        loggers and checkpoints write."""
        self.loop.run_dir = Path(run_dir)

    def evaluate(self) -> Mapping[str, Any]:
        """Lightning's validation loop: the epoch values the module logged, under the
        names it logged them (``NamedMetrics``: ``val_loss`` stays ``val_loss``)."""
        if self.loop.eval_data is None:
            raise ValueError(
                "no validation data: give the module (or datamodule) val_dataloader() and "
                "validation_step() to evaluate"
            )
        values = self.loop.validate(self.config.eval_batches)
        if not values:
            raise ValueError(
                "validation_step logged nothing (self.log): log the values to evaluate"
            )
        return NamedMetrics(values)

    # -- resuming with changed settings ---------------------------------------------
    @property
    def changeable_settings(self) -> frozenset[str]:
        """The schedules come from ``configure_optimizers``: rebuilt when one of their
        settings changes (a module without one has nothing to rebuild)."""
        return SCHEDULE_SETTINGS

    def apply_changed_settings(self, changes: Mapping[str, Any]) -> set[str]:
        """After ``load``: the learning rates and schedules ``configure_optimizers`` built
        (with the new settings) replace the restored ones (as ``FabricBackend``'s)."""
        assert self._as_built is not None and self.parts is not None, "called after setup"
        return self._as_built.reapply(self.parts.optimizer, self.parts.schedulers, changes)

    # -- checkpoints: FabricCheckpointIO with checkpoint_io.py's parts ----------------
    def claims_checkpoint(self, saved_name: str, directory: Path) -> bool:
        """A checkpoint recorded as ``fabric`` (as this backend's were before it had its
        own name) is this backend's when it holds the LightningModule loop's state
        (``baton.core.checkpoint_record.ClaimsRenamedCheckpoints``)."""
        return saved_name == FORMER_NAME and holds_loop_state(directory)

    def teardown(self) -> None:
        """Wait for a save still being written; then the loop's and hooks' ends."""
        self.checkpoints.close()
        self._corruption = None
        if self.runtime.fabric is None:
            return
        self.loop.finish()
        if self.datamodule is not None:
            self.datamodule.teardown("fit")
        self.module.teardown("fit")


def check_callbacks(callbacks: Sequence[Any]) -> list[Any]:
    """Lightning callbacks baton can run; those with a baton equivalent are refused, naming it."""
    import lightning.pytorch as pl

    equivalents = {
        "ModelCheckpoint": "baton.callbacks.Checkpoint",
        "EarlyStopping": "baton.callbacks.EarlyStopping",
        "LearningRateMonitor": "baton.callbacks.OptimizerMonitor",
        "TQDMProgressBar": "baton's console sink",
        "RichProgressBar": "baton's console sink",
    }
    accepted = []
    for callback in callbacks:
        if not isinstance(callback, pl.Callback):
            raise TypeError(
                f"callbacks= takes lightning.pytorch.Callback objects, got "
                f"{type(callback).__name__}; baton callbacks go to the Driver"
            )
        for base in type(callback).__mro__:
            if base.__name__ in equivalents and base.__module__.startswith("lightning"):
                raise LightningHookError(
                    f"{type(callback).__name__} is a Trainer callback baton does not run: use "
                    f"{equivalents[base.__name__]} instead"
                )
        accepted.append(callback)
    return accepted
