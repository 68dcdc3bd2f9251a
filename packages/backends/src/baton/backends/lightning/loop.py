"""``Trainer.fit``'s loop, one optimizer step at a time, for baton's ``LightningBackend``.

``LightningLoop.train_step`` runs the batches of one optimizer step exactly as
``lightning.pytorch.Trainer.fit`` runs them (automatic optimization):

- the data is read one batch ahead; the optimizer steps when ``accumulate_grad_batches``
  batches are in, and on the epoch's last batch whatever the window holds;
- each batch: ``on_train_batch_start`` -> ``training_step`` -> the loss divided by
  ``accumulate_grad_batches`` -> ``on_before_backward`` -> backward -> ``on_after_backward``;
  on the stepping batch all of it runs inside ``optimizer_step``'s closure, followed by
  ``on_before_optimizer_step`` and ``configure_gradient_clipping``; ``on_before_zero_grad``
  and ``optimizer_zero_grad`` on the window's first batch, after its ``training_step``;
- schedulers as the Trainer steps them: ``interval="step"`` every ``frequency`` batches of
  the epoch (stepping batches only) before ``on_train_batch_end``; ``interval="epoch"`` on
  the epoch's last batch; ``ReduceLROnPlateau`` after validation (step interval) or after
  ``on_train_epoch_end`` (epoch interval), with the monitored value from
  ``callback_metrics``;
- validation runs where baton's driver evaluates (``validate``), after the step's
  batch, before the plateau schedulers and the epoch's end (``on_train_epoch_end``),
  which therefore run at the start of the next step, as in the Trainer. Validation draws
  from the global random state as the Trainer's does (a DataLoader iterator's seed);
- the sanity check (``num_sanity_val_steps`` batches of validation, random state isolated)
  runs before the first step of each process, as each ``Trainer.fit`` call does.

Lightning callbacks run beside the module's hooks, callbacks first, with
``(trainer, pl_module, ...)`` as Lightning passes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from baton.backends.fabric.config import FabricConfig
from baton.backends.fabric.runtime import FabricRuntime
from baton.backends.lightning.hooks import Hooks
from baton.backends.lightning.manual import run_manual_batch
from baton.backends.lightning.stream import EpochStream
from baton.backends.lightning.trainer import TrainerView
from baton.backends.lightning.validation import isolated_rng, validate
from baton.core.backend import DataExhausted


class LightningLoop:
    """The state and steps of ``Trainer.fit`` for one module (see the module docs).

    Args:
        runtime: the run's ``FabricRuntime`` (its Fabric, once launched).
        module: the LightningModule.
        datamodule: its LightningDataModule, if any.
        config: the run's ``FabricConfig`` (clipping, accumulation).
        before_clipping: the model-state view's hook, called before gradients are clipped.
        callbacks: the Lightning callbacks.

    The backend's ``setup`` hands it what it builds: ``model`` (the module as Fabric set
    it up), ``eval_data``, ``stream``, the optimizers and the scheduler configs.

    Example::

        loop = LightningLoop(runtime, module, None, config, lambda: None, callbacks=[],
                             max_steps=100, max_epochs=None, num_sanity_val_steps=2)
    """

    def __init__(
        self,
        runtime: FabricRuntime,
        module: Any,
        datamodule: Any,
        config: FabricConfig,
        before_clipping: Callable[[], None],
        *,
        callbacks: list[Any],
        max_steps: int | None,
        max_epochs: int | None,
        num_sanity_val_steps: int,
        run_dir: Any = None,
    ) -> None:
        self.runtime = runtime
        self.module = module
        self.datamodule = datamodule
        self.config = config
        self.before_clipping = before_clipping
        #: the module as Fabric set it up (``setup``)
        self.model: Any = None
        #: the validation batches (``setup``: the data hooks' ``val_dataloader``)
        self.eval_data: Any = None
        self.callbacks = callbacks
        self.max_steps = max_steps
        self.max_epochs = max_epochs
        self.num_sanity_val_steps = num_sanity_val_steps
        self.run_dir = run_dir
        self.global_step = 0
        self.grad_norm: torch.Tensor | None = None
        #: the batches of the last step (baton counts their samples and tokens)
        self.step_batches: list[Any] = []
        self.stream: EpochStream | None = None
        self.optimizers: list[Any] = []
        self.lightning_optimizers: list[Any] = []
        self.scheduler_configs: list[Any] = []
        self.trainer = TrainerView(self)
        self.hooks = Hooks(module, callbacks, self.trainer)
        #: batch index of the last stepping batch whose after-validation work is pending
        self._pending_batch: int | None = None
        self._started = False
        self._restored_metrics: dict[str, Any] = {}

    # -- what the trainer view reads -------------------------------------------------
    @property
    def fabric(self) -> Any:
        return self.runtime.fabric

    @property
    def current_epoch(self) -> int:
        return self.stream.epoch if self.stream is not None else 0

    def batches_per_epoch(self) -> int | float:
        data = self.stream.data if self.stream is not None else None
        try:
            return len(data)  # type: ignore[arg-type]
        except TypeError:
            return float("inf")

    def estimated_stepping_batches(self) -> int | float:
        """As ``Trainer.estimated_stepping_batches`` for ``Trainer(max_steps, max_epochs)``."""
        if self.max_epochs is None:
            if self.max_steps is None:
                raise AttributeError(
                    "self.trainer.estimated_stepping_batches needs the run's length: pass "
                    "max_steps= or max_epochs= to LightningBackend (under manual "
                    "optimization, max_steps counts the Trainer's optimizer steps)"
                )
            return self.max_steps
        batches = self.batches_per_epoch()
        if batches == float("inf"):
            return self.max_steps if self.max_steps is not None else float("inf")
        steps = -(-int(batches) // self.config.grad_accum) * max(self.max_epochs, 1)
        return min(steps, self.max_steps) if self.max_steps is not None else steps

    # -- hooks -------------------------------------------------------------------------
    def hook(self, name: str, *args: Any) -> Any:
        """Lightning callbacks' ``name`` then the module's, as the Trainer calls them
        (``Hooks``: calls that would do nothing are left out)."""
        return self.hooks(name, *args)

    def module_hook(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.hooks.module_hook(name, *args, **kwargs)

    # -- training ----------------------------------------------------------------------
    def start(self) -> None:
        """``on_fit_start``, the sanity check and ``on_train_start`` (first step of a process)."""
        self._started = True
        self.hook("on_fit_start")
        if self.num_sanity_val_steps > 0 and self.eval_data is not None:
            with isolated_rng(self.fabric.device):
                for callback in self.callbacks:
                    callback.on_sanity_check_start(self.trainer, self.module)
                connector = self.trainer._logger_connector
                connector.reset_results()
                connector.reset_metrics()
                self.validate(self.num_sanity_val_steps, stage="sanity_check")
                for callback in self.callbacks:
                    callback.on_sanity_check_end(self.trainer, self.module)
                connector.reset_results()
                connector.reset_metrics()
        self.trainer._logger_connector._callback_metrics.update(self._restored_metrics)
        self.module.train()
        self.hook("on_train_start")

    def finish(self) -> None:
        """``on_train_end`` and ``on_fit_end`` (the run stopped), if training started."""
        if self._started:
            self._started = False
            if self.stream is not None and self.stream.started:
                self._finish_pending(stopping=True)  # the Trainer ends the epoch it stops in
            self.hook("on_train_end")
            self.hook("on_fit_end")

    def train_step(self) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """One optimizer step (manual optimization: one batch): ``(mean loss of its
        batches, lazy metrics)``; no loss where a manual ``training_step`` returned none."""
        assert self.stream is not None
        if not self._started:
            self.start()
        metrics = self._finish_pending()
        losses: list[torch.Tensor] = []
        self.grad_norm = None
        self.step_batches = []
        while True:
            if not self.stream.started:
                self._start_epoch()
            batch, batch_idx, is_last = self.stream.next_batch()
            stepping = (batch_idx + 1) % self.config.grad_accum == 0 or is_last
            loss = self._run_batch(batch, batch_idx, stepping, is_last)
            if loss is not None:
                losses.append(loss)
            if stepping:
                break
        metrics.update(self.trainer._train_results.metrics(True)["log"])
        if self.grad_norm is not None:
            metrics["grad_norm"] = self.grad_norm
        self._pending_batch = batch_idx
        if not losses:
            return None, metrics
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return (total if len(losses) == 1 else total / len(losses)), metrics

    def _start_epoch(self) -> None:
        assert self.stream is not None
        if self.max_epochs is not None and self.max_epochs >= 0:
            if self.stream.epoch >= self.max_epochs:
                raise DataExhausted(f"max_epochs={self.max_epochs} reached")
        self.hook("on_train_epoch_start")
        self.stream.begin()

    def _run_batch(self, batch: Any, batch_idx: int, stepping: bool, is_last: bool) -> Any:
        self.step_batches.append(batch)
        batch = self.fabric.to_device(batch)
        self.trainer._logger_connector.on_batch_start(batch)
        if self.hook("on_train_batch_start", batch, batch_idx) == -1:
            raise NotImplementedError(
                "on_train_batch_start returned -1 (skip the rest of the epoch): baton's "
                "LightningBackend does not support it; stop with a baton callback instead"
            )
        result: dict[str, Any] = {}

        def closure() -> torch.Tensor:
            result.update(self._forward_backward(batch, batch_idx, stepping))
            return result["closure_loss"]

        if not self.module.automatic_optimization:
            result["extra"], result["loss"] = run_manual_batch(self, batch, batch_idx)
        elif stepping:
            if self.hooks.module_overrides("optimizer_step"):
                optimizer = self.lightning_optimizers[0]
                epoch = self.current_epoch
                self.module_hook("optimizer_step", epoch, batch_idx, optimizer, closure)
            else:  # where Lightning's optimizer_step -> LightningOptimizer.step end
                self.optimizer_step(self.optimizers[0], closure)
            self.global_step += 1
            self._step_schedulers("step", plateau=False, index=batch_idx + 1)
            if is_last:
                self._step_schedulers("epoch", plateau=False, index=self.current_epoch + 1)
        else:
            closure()
        if self.hooks.overridden("on_train_batch_end"):
            outputs = dict(result["extra"])
            if result.get("normalized") is not None:
                outputs = {"loss": result["normalized"], **outputs}
            self.hook("on_train_batch_end", outputs, batch, batch_idx)
        self.trainer._logger_connector.on_batch_end()
        return result["loss"]

    def _forward_backward(self, batch: Any, batch_idx: int, stepping: bool) -> dict[str, Any]:
        from baton.backends.fabric.step import split_loss

        accum = self.config.grad_accum
        with self.fabric.no_backward_sync(self.model, enabled=not stepping):
            previous = self.hooks.fx_name("training_step")
            try:
                output = self.model.training_step(batch, batch_idx)
            finally:
                self.hooks.restore_fx_name(previous)
            if output is None:
                raise ValueError(
                    "training_step returned None (Lightning skips the step); baton's "
                    "LightningBackend needs the loss: return it (or a dict with 'loss')"
                )
            loss, extra = split_loss(output)
            # x / 1 is x bit for bit, forward and backward: the Trainer's division by 1
            # is a kernel and an autograd node that change nothing
            normalized = loss / accum if accum != 1 else loss
            if batch_idx % accum == 0:
                optimizer = self.optimizers[0].optimizer
                self.hook("on_before_zero_grad", optimizer)
                self.module_hook("optimizer_zero_grad", self.current_epoch, batch_idx, optimizer)
            self.backward(normalized)
        listened = self.hooks.overridden("on_train_batch_end")  # the outputs' only reader
        return {
            "closure_loss": normalized,
            "normalized": normalized.detach().clone() if listened else None,
            "loss": loss.detach(),
            "extra": extra,
        }

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``on_before_backward`` -> backward -> ``on_after_backward`` (also ``manual_backward``)."""
        self.hook("on_before_backward", loss)
        self.fabric.backward(loss, *args, **kwargs)
        self.hook("on_after_backward")

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """A ``LightningOptimizer.step(closure)``: the closure, ``on_before_optimizer_step``,
        gradient clipping (automatic optimization), then the optimizer's step."""
        raw = getattr(optimizer, "optimizer", optimizer)

        def after_closure() -> Any:
            output = closure()
            self.hook("on_before_optimizer_step", raw)
            self.before_clipping()
            if self.module.automatic_optimization:
                self._clip_gradients(raw)
            return output

        return optimizer.step(closure=after_closure, **kwargs)

    def _clip_gradients(self, optimizer: Any) -> None:
        """``configure_gradient_clipping`` with the Trainer's settings. Where the module
        keeps Lightning's ``configure_gradient_clipping`` and ``clip_gradients``, what they
        end in is called directly: the clipping of ``gradient_clip_val`` (none without
        one), without their checks of values that come from the validated config."""
        clip_val, algorithm = self.config.grad_clip, self.trainer.gradient_clip_algorithm
        if isinstance(clip_val, int | float | None) and not self.hooks.module_overrides(
            "configure_gradient_clipping", "clip_gradients"
        ):
            if clip_val is not None:
                self.trainer.strategy.clip_gradients(optimizer, clip_val, algorithm)
            return
        self.module_hook(
            "configure_gradient_clipping",
            optimizer,
            gradient_clip_val=clip_val,
            gradient_clip_algorithm=algorithm,
        )

    def _step_schedulers(self, interval: str, *, plateau: bool, index: int) -> None:
        """As ``Trainer``'s ``_update_learning_rates``."""
        if not self.module.automatic_optimization:
            return
        for config in self.scheduler_configs:
            if plateau != config.reduce_on_plateau:
                continue
            if config.interval != interval or index % config.frequency != 0:
                continue
            monitored = None
            if config.reduce_on_plateau:
                monitored = self.trainer.callback_metrics.get(config.monitor)
                if monitored is None:
                    if config.strict:
                        raise KeyError(
                            f"ReduceLROnPlateau conditioned on metric {config.monitor!r}, which "
                            f"is not available; available: {sorted(self.trainer.callback_metrics)}"
                        )
                    continue
            if self.hooks.module_overrides("lr_scheduler_step"):
                self.module_hook("lr_scheduler_step", config.scheduler, monitored)
            elif monitored is None:  # Lightning's lr_scheduler_step
                config.scheduler.step()
            else:
                config.scheduler.step(monitored)

    def _finish_pending(self, stopping: bool = False) -> dict[str, Any]:
        """What the Trainer runs after validation: plateau schedulers, the epoch's end
        (also where the run stops mid-epoch)."""
        assert self.stream is not None
        if self._pending_batch is None:
            return {}
        batch_idx, self._pending_batch = self._pending_batch, None
        self._step_schedulers("step", plateau=True, index=batch_idx + 1)
        if not (self.stream.epoch_done or stopping):
            return {}
        connector = self.trainer._logger_connector
        connector.epoch_end_reached()
        self.hook("on_train_epoch_end")
        connector.on_epoch_end()
        if self.stream.epoch_done:
            self._step_schedulers("epoch", plateau=True, index=self.current_epoch + 1)
        epoch_metrics = dict(self.trainer._train_results.metrics(False)["log"])
        connector.reset_results()
        self.stream.end_epoch()
        return epoch_metrics

    # -- validation: validation.py --------------------------------------------------
    def validate(self, limit: int | None, stage: str = "validate") -> dict[str, Any]:
        """``Trainer``'s validation loop over the evaluation data: the epoch-level values
        the module logged (``self.log`` in ``validation_step``/``on_validation_epoch_end``)."""
        return validate(self, limit, stage)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        metrics = {
            k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
            for k, v in self.trainer.callback_metrics.items()
        }
        return {
            "global_step": self.global_step,
            "pending_batch": self._pending_batch,
            "callback_metrics": metrics,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self._pending_batch = state["pending_batch"]
        device = self.fabric.device
        # set again after the sanity check, which clears them (start)
        self._restored_metrics = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in state["callback_metrics"].items()
        }
