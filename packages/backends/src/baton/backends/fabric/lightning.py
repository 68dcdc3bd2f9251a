"""An existing ``LightningModule`` (and ``LightningDataModule``), unchanged, under baton.

``LightningBackend`` runs what ``lightning.pytorch.Trainer.fit`` would run, one optimizer
step at a time through Fabric: ``prepare_data``/``setup("fit")``/``configure_model``,
``configure_optimizers`` (an optimizer, lists, or dicts with ``lr_scheduler`` configs:
``interval`` ``"step"``/``"epoch"`` and ``frequency`` honoured as the Trainer does),
``train_dataloader``/``val_dataloader`` (from the datamodule when given),
``training_step(batch, batch_idx)``, ``validation_step`` for evaluation,
``on_train_epoch_end``, ``on_save_checkpoint``/``on_load_checkpoint`` and ``teardown``.
``self.log(...)`` values stay tensors until baton's log step (training: the step's
value; evaluation: the mean over the evaluation batches).

Trainer settings live in ``FabricConfig`` (``grad_clip`` is ``gradient_clip_val``,
``grad_accum`` is ``accumulate_grad_batches``, ``precision``, ``strategy``). A hook the
module overrides that baton does not call (``on_train_batch_end``,
``configure_gradient_clipping``, manual optimization, ...) is an error listing them all,
never silently skipped.

Example::

    from baton.backends.fabric import FabricConfig, LightningBackend
    from baton.core import Driver

    backend = LightningBackend(LitModel(), datamodule=MNISTDataModule(),
                               config=FabricConfig(grad_clip=1.0))
    Driver(backend, max_steps=1000, eval_every=200, run_dir="runs/lit").fit()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from baton.backends.fabric.backend import FabricBackend, FabricConfig, split_loss
from baton.backends.fabric.changes import SCHEDULE_SETTINGS, AsBuilt

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
        "on_train_epoch_end",
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


class _LazyLogs:
    """Where ``self.log`` values go: kept as detached tensors until read."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def take(self) -> dict[str, Any]:
        values, self.values = self.values, {}
        return values


def _lazy_fabric_class() -> type:
    from lightning.fabric import Fabric

    class LazyLogFabric(Fabric):
        """Fabric whose ``log_dict`` (where ``LightningModule.log`` goes) keeps tensors
        instead of converting them to numbers (a device sync per call)."""

        logs: _LazyLogs

        def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
            for name, value in metrics.items():
                self.logs.values[name] = (
                    value.detach() if isinstance(value, torch.Tensor) else float(value)
                )

    return LazyLogFabric


class LightningBackend(FabricBackend):
    """A ``lightning.pytorch.LightningModule`` (+ optional ``LightningDataModule``) through Fabric.

    Args:
        module: the LightningModule, as written for ``Trainer.fit``.
        datamodule: its data, if not the module's own ``train_dataloader``.
        config: Fabric and loop settings (gradient clipping, accumulation, precision...).
        count_tokens / flops_per_token / describe: as for ``FabricBackend``.
    """

    def __init__(
        self,
        module: Any,
        datamodule: Any = None,
        *,
        config: FabricConfig | None = None,
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
        if not module.automatic_optimization:
            raise LightningHookError(
                f"{type(module).__name__} uses manual optimization (automatic_optimization = "
                "False); baton drives automatic optimization only: use FabricBackend with "
                "training_step(model, batch) for a hand-written step"
            )
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
        super().__init__(
            model=module,
            config=config,
            count_tokens=count_tokens,
            flops_per_token=flops_per_token,
            describe=describe,
            **overrides,
        )
        self.module = module
        self.datamodule = datamodule
        self.logs = _LazyLogs()
        self.scheduler_configs: list[Any] = []

    def _fabric_class(self) -> type:
        return _lazy_fabric_class()

    # -- build ------------------------------------------------------------------------
    def setup(self) -> None:
        self.config.check()
        self.fabric = self._make_fabric()
        self.fabric.logs = self.logs
        self.fabric.launch()
        self._device = self.fabric.device
        if self.config.seed is not None:
            from lightning.fabric.utilities.seed import seed_everything

            seed_everything(self.config.seed, verbose=False)
        data_hooks = self.datamodule if self.datamodule is not None else self.module
        if self.fabric.local_rank == 0:
            if self.datamodule is not None:
                self.datamodule.prepare_data()
            self.module.prepare_data()
        self.fabric.barrier()
        if self.datamodule is not None:
            self.datamodule.setup("fit")
        self.module.setup("fit")
        with self.fabric.init_module(empty_init=self._sharded()):
            self.module.configure_model()
        self.raw_model = self.module
        self._num_params = sum(p.numel() for p in self.module.parameters())
        if self.config.init_from:
            from baton.backends.fabric.weights import load_weights

            load_weights(self.module, self.config.init_from)
        self.model = self.fabric.setup_module(self.module)
        self.optimizer = self.fabric.setup_optimizers(self._configure_optimizers())
        self.stream = self._make_stream(data_hooks.train_dataloader())
        if self.eval_data is None and _overrides(self.module, "validation_step"):
            self.eval_data = data_hooks.val_dataloader()
        self._as_built = AsBuilt.take(self.optimizer, self._schedulers())

    def _schedulers(self) -> list[Any]:
        return [config.scheduler for config in self.scheduler_configs]

    @property
    def changeable_settings(self) -> frozenset[str]:
        """The schedules come from ``configure_optimizers``: rebuilt when one of their
        settings changes (a module without one has nothing to rebuild)."""
        return SCHEDULE_SETTINGS

    def _configure_optimizers(self) -> torch.optim.Optimizer:
        from lightning.pytorch.core.optimizer import (
            _configure_optimizers,
            _configure_schedulers_automatic_opt,
        )

        optimizers, schedulers, monitor = _configure_optimizers(self.module.configure_optimizers())
        if len(optimizers) != 1:
            raise LightningHookError(
                f"configure_optimizers returned {len(optimizers)} optimizers; baton's automatic "
                "optimization steps exactly one (several need manual optimization)"
            )
        configs = _configure_schedulers_automatic_opt(schedulers, monitor)
        for config in configs:
            if config.reduce_on_plateau:
                raise LightningHookError(
                    f"the ReduceLROnPlateau scheduler (monitor {config.monitor!r}) needs a "
                    "validation metric at each step; baton cannot honour it: use a step or "
                    "epoch schedule"
                )
        self.scheduler_configs = configs
        return optimizers[0]

    # -- the step ---------------------------------------------------------------------
    def _compute_loss(self, batch: Any, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        assert self.stream is not None
        output = self.model.training_step(batch, self.stream.batches - 1)
        if output is None:
            raise LightningHookError(
                "training_step returned None (Lightning skips the step); baton needs the loss: "
                "return it (or a dict with 'loss')"
            )
        loss, _ = split_loss(output)
        return loss, self.logs.take()

    def _optimizer_step(self) -> None:
        assert self.stream is not None
        self.optimizer.step()
        for config in self.scheduler_configs:
            # as the Trainer: a step schedule advances when the batch count in the epoch
            # (1-based) is a multiple of its frequency
            if config.interval == "step" and self.stream.batches % config.frequency == 0:
                config.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _epoch_ended(self, epoch: int) -> None:
        if _overrides(self.module, "on_train_epoch_end"):
            self.module.on_train_epoch_end()
            self.logs.take()  # epoch-level logs have no step to belong to
        for config in self.scheduler_configs:
            if config.interval == "epoch" and (epoch + 1) % config.frequency == 0:
                config.scheduler.step()

    def _eval_values(self, batch: Any, index: int) -> dict[str, Any]:
        output = self.model.validation_step(batch, index)
        values = self.logs.take()
        if output is not None:
            loss, extra = split_loss(output)
            if isinstance(loss, torch.Tensor):
                values.setdefault("loss", loss.detach())
            for key, value in extra.items():
                values.setdefault(key, value)
        if not values:
            raise ValueError(
                "validation_step neither logged (self.log) nor returned a value to evaluate"
            )
        return values

    # -- checkpoints ----------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer}
        for i, config in enumerate(self.scheduler_configs):
            state[f"scheduler_{i}"] = config.scheduler
        return state

    def _extra_state(self) -> dict[str, Any]:
        state = super()._extra_state()
        assert self.stream is not None
        checkpoint: dict[str, Any] = {"epoch": self.stream.epoch}
        if self.datamodule is not None:
            checkpoint[type(self.datamodule).__qualname__] = self.datamodule.state_dict()
        self.module.on_save_checkpoint(checkpoint)
        state["lightning"] = checkpoint
        return state

    def _load_extra_state(self, remainder: dict[str, Any]) -> None:
        super()._load_extra_state(remainder)
        checkpoint = remainder.get("lightning", {})
        if self.datamodule is not None:
            key = type(self.datamodule).__qualname__
            if key in checkpoint:
                self.datamodule.load_state_dict(checkpoint[key])
        self.module.on_load_checkpoint(checkpoint)

    def teardown(self) -> None:
        if self.fabric is None:
            return
        if self.datamodule is not None:
            self.datamodule.teardown("fit")
        self.module.teardown("fit")


def _overrides(module: Any, name: str) -> bool:
    import lightning.pytorch as pl

    return getattr(type(module), name, None) is not getattr(pl.LightningModule, name)
