"""The ``self.trainer`` a LightningModule sees under baton's ``LightningBackend``.

A module reads the Trainer's state (``self.trainer.estimated_stepping_batches`` to size a
OneCycleLR, ``current_epoch``, ``global_step``, ``callback_metrics``...) and logs through it
(``self.log`` goes to the Trainer's result collection). ``TrainerView`` answers those
reads from baton's run, and keeps logged values in Lightning's own result collection and
logger connector, so ``on_step``/``on_epoch``/``reduce_fx``/``sync_dist``/``batch_size``
behave exactly as under ``Trainer.fit``. Anything else a module touches on
``self.trainer`` fails with an ``AttributeError`` naming the attribute.

Example (inside a module run by ``LightningBackend``)::

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches    # answered by TrainerView
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": OneCycleLR(optimizer, 1e-2, total_steps=total),
                                 "interval": "step"}}
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: what a module may read on ``self.trainer`` (documented for users; see ``TrainerView``)
PROVIDED = (
    "estimated_stepping_batches",
    "max_steps",
    "max_epochs",
    "current_epoch",
    "global_step",
    "is_global_zero",
    "world_size",
    "num_devices",
    "datamodule",
    "optimizers",
    "lr_scheduler_configs",
    "callback_metrics",
    "logged_metrics",
    "progress_bar_metrics",
    "sanity_checking",
    "training",
    "validating",
    "log_dir",
    "lightning_module",
    "model",
    "strategy",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "num_training_batches",
    "should_stop",
)


@functools.cache
def settled_results_class(results: type) -> type:
    """Lightning's result collection (``results``) whose metrics skip moving their state to
    the logged value's device when it already is there.

    ``self.log`` calls ``metric.to(value.device)`` at every call, which walks the metric's
    whole ``__dict__`` (its module dictionaries and metadata included) to move each tensor:
    about a millisecond per logged value, a tenth of a small model's step, for nothing
    once the state lives on that device. A metric whose tensors (its state, defaults and
    caches) are all on the device returns at once; any other call moves as Lightning does,
    so the values are Lightning's, bit for bit. Once a metric was found on a device, it is
    not searched again until it is moved (``_apply``): what ``self.log`` writes into it is
    computed from values on the device it was just asked to be on."""
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric

    class SettledMetric(_ResultMetric):
        _settled_on: Any = None  # the device all its tensors were last found on

        def to(self, *args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and not kwargs and self.is_tensor:
                if self._settled_on == args[0]:
                    return self
                if _on(self.__dict__, args[0]):
                    object.__setattr__(self, "_settled_on", args[0])
                    return self
            return super().to(*args, **kwargs)

        def _apply(self, *args: Any, **kwargs: Any) -> Any:
            object.__setattr__(self, "_settled_on", None)  # moved: search again next time
            return super()._apply(*args, **kwargs)

    class SettledResults(results):
        def __setitem__(self, key: str, metric: Any) -> None:
            if type(metric) is _ResultMetric:
                metric.__class__ = SettledMetric  # the same object, a faster ``to``
            super().__setitem__(key, metric)

    return SettledResults


def _on(state: dict[str, Any], device: Any) -> bool:
    """Whether every tensor of a result metric's state (its attributes and the defaults
    ``reset`` restores) is on ``device``; ``False`` where a state is not a plain tensor."""
    defaults = state.get("_defaults", {})
    if not all(isinstance(v, torch.Tensor) for v in defaults.values()):
        return False
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    return all(t.device == device for t in (*tensors, *defaults.values()))


class TrainerView:
    """What a LightningModule may read on ``self.trainer`` during a baton run.

    ``loop`` is the object that knows the run's progress (``LightningLoop``); the view
    reads it live, so values are those of the moment the module asks.
    """

    def __init__(self, loop: Any) -> None:
        from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import (
            _LoggerConnector,
        )
        from lightning.pytorch.trainer.connectors.logger_connector.result import (
            _ResultCollection,
        )

        self._loop = loop
        #: ``train``, ``validate`` or ``sanity_check``
        self.stage = "train"
        self.testing = False
        self.predicting = False
        self.barebones = False
        self.logger = None
        self.loggers: list[Any] = []
        self.should_stop = False
        self.gradient_clip_algorithm = "norm"
        settled = settled_results_class(_ResultCollection)
        self._train_results = settled(training=True)
        self._val_results = settled(training=False)
        self._logger_connector = _LoggerConnector(self)  # type: ignore[arg-type]
        #: ``self.log`` calls Lightning accepted (``log_fast_path``): call -> stored metric
        self._log_calls: dict[tuple[Any, ...], tuple[str, Any, int | None]] = {}
        self.strategy = StrategyView(loop)
        self.precision_plugin = self.strategy

    # -- the run's state ---------------------------------------------------------------
    @property
    def training(self) -> bool:
        return self.stage == "train"

    @property
    def validating(self) -> bool:
        return self.stage == "validate"

    @property
    def sanity_checking(self) -> bool:
        return self.stage == "sanity_check"

    @property
    def state(self) -> Any:
        from lightning.pytorch.trainer.states import TrainerFn, TrainerState, TrainerStatus

        return TrainerState(fn=TrainerFn.FITTING, status=TrainerStatus.RUNNING)

    @property
    def _results(self) -> Any:
        return self._train_results if self.training else self._val_results

    @property
    def current_epoch(self) -> int:
        return self._loop.current_epoch

    @property
    def global_step(self) -> int:
        return self._loop.global_step

    @property
    def max_steps(self) -> int:
        return self._loop.max_steps if self._loop.max_steps is not None else -1

    @property
    def max_epochs(self) -> int | None:
        return self._loop.max_epochs

    @property
    def num_training_batches(self) -> int | float:
        return self._loop.batches_per_epoch()

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps of the whole run, as the Trainer estimates them."""
        return self._loop.estimated_stepping_batches()

    @property
    def accumulate_grad_batches(self) -> int:
        return self._loop.config.grad_accum

    @property
    def gradient_clip_val(self) -> float | None:
        return self._loop.config.grad_clip

    # -- the run's objects -------------------------------------------------------------
    @property
    def lightning_module(self) -> Any:
        return self._loop.module

    @property
    def model(self) -> Any:
        return self._loop.model

    @property
    def datamodule(self) -> Any:
        return self._loop.datamodule

    @property
    def optimizers(self) -> list[Any]:
        return [opt.optimizer for opt in self._loop.optimizers]

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        return self._loop.scheduler_configs

    @property
    def callbacks(self) -> list[Any]:
        return list(self._loop.callbacks)

    @property
    def is_global_zero(self) -> bool:
        return self._loop.fabric.global_rank == 0

    @property
    def global_rank(self) -> int:
        return self._loop.fabric.global_rank

    @property
    def local_rank(self) -> int:
        return self._loop.fabric.local_rank

    @property
    def world_size(self) -> int:
        return self._loop.fabric.world_size

    @property
    def num_devices(self) -> int:
        return len(getattr(self._loop.fabric.strategy, "parallel_devices", None) or [None])

    @property
    def num_nodes(self) -> int:
        return max(1, self._loop.fabric.world_size // self.num_devices)

    @property
    def log_dir(self) -> str | None:
        run_dir = self._loop.run_dir
        return str(Path(run_dir) / "logs") if run_dir is not None else None

    @property
    def default_root_dir(self) -> str:
        run_dir = self._loop.run_dir
        return str(run_dir) if run_dir is not None else str(Path.cwd())

    @property
    def _accelerator_connector(self) -> Any:
        return _Distributed(self._loop.fabric.world_size > 1)

    # -- logged values -----------------------------------------------------------------
    @property
    def callback_metrics(self) -> dict[str, Any]:
        return self._logger_connector.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        return self._logger_connector.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        return self._logger_connector.progress_bar_metrics

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"self.trainer.{name} is not available under baton's LightningBackend (a module "
            f"may read: {', '.join(PROVIDED)}); read it from the module or the baton driver "
            "instead, or train with lightning.pytorch.Trainer"
        )


class _Distributed:
    def __init__(self, distributed: bool) -> None:
        self.is_distributed = distributed


class StrategyView:
    """The parts of a Trainer's strategy (and precision plugin) a module's calls reach:
    ``self.log(sync_dist=True)`` (``reduce``), ``manual_backward`` (``backward``),
    ``optimizer.step()`` of a ``LightningOptimizer`` (``optimizer_step``),
    ``self.clip_gradients`` (``clip_gradients``)."""

    def __init__(self, loop: Any) -> None:
        self._loop = loop

    @property
    def _lightning_module(self) -> Any:
        return self._loop.module

    @property
    def lightning_module(self) -> Any:
        return self._loop.module

    @property
    def _lightning_optimizers(self) -> list[Any]:
        return self._loop.lightning_optimizers

    @property
    def root_device(self) -> torch.device:
        return self._loop.fabric.device

    @property
    def is_global_zero(self) -> bool:
        return self._loop.fabric.global_rank == 0

    @property
    def handles_gradient_accumulation(self) -> bool:
        return False

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        return self._loop.fabric.strategy.all_reduce(tensor, group=group, reduce_op=reduce_op)

    def barrier(self, name: str | None = None) -> None:
        self._loop.fabric.barrier(name)

    def backward(self, loss: torch.Tensor, optimizer: Any = None, *args: Any, **kw: Any) -> Any:
        return self._loop.backward(loss, *args, **kw)

    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        return self._loop.optimizer_step(optimizer, closure, **kwargs)

    def clip_gradients(
        self, optimizer: Any, clip_val: float | int = 0.0, gradient_clip_algorithm: Any = "norm"
    ) -> None:
        """As Lightning's precision plugin: by norm or value, over the optimizer's parameters."""
        if clip_val <= 0:
            return
        optimizer = getattr(optimizer, "optimizer", optimizer)
        optimizer = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer, then Fabric's
        self._loop.fabric.strategy.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value":
            torch.nn.utils.clip_grad_value_(params, clip_val)
        else:
            self._loop.grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_val)
