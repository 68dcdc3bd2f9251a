"""Hooks: the calls Trainer.fit makes, minus those of empty hooks nobody overrides."""

from __future__ import annotations

import ast
import inspect
import textwrap

import lightning.pytorch as pl
import pytest
import torch

from baton.backends.lightning.hooks import NO_OP_HOOKS, Hooks


def _body_is_empty(function: object) -> bool:
    source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return all(isinstance(node, ast.Pass) for node in body[1 if docstring else 0 :])


def test_the_hooks_left_out_are_empty_in_lightning():
    """A Lightning release that gives one of them a body fails here, not silently."""
    for name in sorted(NO_OP_HOOKS):
        assert _body_is_empty(getattr(pl.LightningModule, name)), f"LightningModule.{name}"
        assert _body_is_empty(getattr(pl.Callback, name)), f"Callback.{name}"


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.calls: list[tuple[str, str | None]] = []

    def on_after_backward(self) -> None:
        self.calls.append(("on_after_backward", self._current_fx_name))


class Watcher(pl.Callback):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_after_backward(self, trainer, pl_module) -> None:
        self.calls.append("on_after_backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.calls.append(f"on_train_batch_end {outputs['loss']} {batch_idx}")


def test_overridden_hooks_run_with_their_name_and_empty_ones_are_left_out():
    module, watcher, idle = Module(), Watcher(), pl.Callback()
    hooks = Hooks(module, [idle, watcher], trainer=None)
    module._current_fx_name = "training_step"

    hooks("on_after_backward")
    hooks("on_train_batch_end", {"loss": 1.5}, None, 3)
    assert hooks("on_before_backward", torch.ones(())) is None  # nobody overrides it

    assert watcher.calls == ["on_after_backward", "on_train_batch_end 1.5 3"]
    assert module.calls == [("on_after_backward", "on_after_backward")]
    assert module._current_fx_name == "training_step"  # restored
    assert hooks.overridden("on_train_batch_end")  # by the watcher
    assert not hooks.overridden("on_before_zero_grad")
    assert hooks.overridden("optimizer_zero_grad")  # not empty in Lightning: always called

    # a hook set on the instance counts as overridden, as Lightning's is_overridden sees it
    seen: list[object] = []

    def on_before_zero_grad(optimizer: object) -> None:
        seen.append(optimizer)

    module.on_before_zero_grad = on_before_zero_grad  # type: ignore[method-assign]
    module.on_after_backward = print  # a builtin: Lightning cannot compare it, so it runs
    hooks = Hooks(module, [], trainer=None)
    hooks("on_before_zero_grad", "optimizer")
    assert seen == ["optimizer"]
    assert hooks.overridden("on_after_backward")
    assert not hooks.module_overrides("configure_gradient_clipping", "clip_gradients")


def test_a_logged_metric_is_searched_for_its_device_until_it_moves():
    from lightning.pytorch.trainer.connectors.logger_connector.result import (
        _ResultCollection,
    )

    from baton.backends.lightning.trainer import settled_results_class

    results = settled_results_class(_ResultCollection)(training=True)
    value = torch.tensor(2.5)
    results.log("training_step", "loss", value, on_step=True, on_epoch=True, batch_size=4)
    metric = results["training_step.loss"]
    cpu = value.device
    assert metric._settled_on == cpu  # found there by self.log's .to(value.device)
    assert metric.to(cpu) is metric
    metric.cpu()  # a move (nn.Module._apply), if only to where it is: searched again
    assert metric._settled_on is None
    results.log("training_step", "loss", value, on_step=True, on_epoch=True, batch_size=4)
    assert metric._settled_on == cpu
    assert metric.compute().item() == 2.5  # mean over the two logged values, as Lightning's


def test_the_log_signature_patch_answers_as_lightning_and_undoes():
    """``lightning_log_signature``: ``self.log``'s check whether ``training_step`` takes
    ``dataloader_iter`` gives Lightning's answers, per function, and is Lightning's own
    function again after the run's undo."""
    from lightning.pytorch.core import module as lightning_module

    from baton.backends.lightning.patches import LightningLogSignature
    from baton.core.patches import PatchRecorder

    class Plain(pl.LightningModule):
        def training_step(self, batch, batch_idx):
            return batch

    class Iterating(pl.LightningModule):
        def training_step(self, dataloader_iter):
            return next(dataloader_iter)

    original = lightning_module.is_param_in_hook_signature
    recorder = PatchRecorder()
    LightningLogSignature().apply(None, recorder)  # type: ignore[arg-type]
    patched = lightning_module.is_param_in_hook_signature
    assert patched is not original
    for cls, expected in ((Plain, False), (Iterating, True)):
        for _ in range(2):  # the second answer is the kept one
            step = cls().training_step
            assert patched(step, "dataloader_iter", explicit=True) is expected
            assert original(step, "dataloader_iter", explicit=True) is expected
    assert recorder.undo() == []
    assert lightning_module.is_param_in_hook_signature is original


@pytest.mark.filterwarnings("ignore:You called `self.log\\('count'")
def test_repeated_log_calls_take_the_fast_path_and_log_what_lightning_logs():
    """``lightning_log_fast_path``: a module logging through the fast path (Lightning's
    ``log`` only for calls it has not accepted yet) ends each step with the result
    collection of one logging through Lightning's ``log`` alone: step and epoch values,
    mean with batch sizes, max, an integer value, a new hook resetting its values, a
    validation stage; a wrong call still gets Lightning's error."""
    from baton.backends.lightning.log_fast_path import log_with_fast_path
    from baton.backends.lightning.trainer import TrainerView

    original = pl.LightningModule.log
    underlying: list[str] = []

    def counted(module, name, value, *args, **kwargs):
        underlying.append(name)
        return original(module, name, value, *args, **kwargs)

    fast = log_with_fast_path(counted)

    def logs(log, module) -> None:
        module._current_fx_name = "training_step"
        log(module, "loss", torch.tensor(2.0) * module.k)
        log(
            module,
            "acc",
            torch.tensor([0.5]) * module.k,
            on_step=True,
            on_epoch=True,
            prog_bar=True,
            batch_size=5,
        )  # the batch holds 3: the given size is what counts
        log(module, "peak", torch.tensor(1.0) + module.k, reduce_fx="max", on_epoch=True)
        log(module, "count", torch.tensor(module.k), on_epoch=True)  # an int: made float
        module._current_fx_name = "on_train_batch_end"
        log(module, "after", torch.tensor(0.25) * module.k, on_step=True, on_epoch=False)

    modules, views = [Module(), Module()], [TrainerView(None), TrainerView(None)]
    for module, view in zip(modules, views, strict=True):
        module.trainer = view
    for k in range(1, 7):
        for log, module, view in zip((fast, original), modules, views, strict=True):
            if k == 5:  # a new epoch: its first batch resets the hooks' epoch values
                view._logger_connector.epoch_end_reached()
            module.k = k
            view._logger_connector.on_batch_start(batch=torch.zeros(3, 2))
            logs(log, module)
            view._logger_connector.on_batch_end()
        step = [view._results.metrics(True) for view in views]
        epoch = [view._results.metrics(False) for view in views]
        assert step[0] == step[1] and epoch[0] == epoch[1]
        states = [
            {
                key: (m.value, getattr(m, "cumulated_batch_size", None))
                for key, m in v._results.items()
            }
            for v in views
        ]  # the accumulated values and batch sizes, not only the means
        assert states[0] == states[1]
        assert step[0]["log"]["acc_step"] == 0.5 * k
    assert epoch[0]["log"]["peak_epoch"] == 7.0 and epoch[0]["log"]["acc_epoch"] == 2.75
    assert underlying == ["loss", "acc", "peak", "count", "after"]  # the first step only

    views[0].stage = views[1].stage = "validate"
    for log, module in zip((fast, original), modules, strict=True):
        for _ in range(2):
            module._current_fx_name = "validation_step"
            log(module, "val_loss", torch.tensor(3.0) * module.k)
    assert views[0]._results.metrics(False) == views[1]._results.metrics(False)
    assert underlying[5:] == ["val_loss"]
    with pytest.raises(Exception, match="single element"):
        fast(modules[0], "val_loss", torch.ones(2))
    with pytest.raises(Exception, match="twice in `validation_step` with different"):
        fast(modules[0], "val_loss", torch.tensor(1.0), on_step=True)


def test_the_log_fast_path_patch_is_lightnings_log_again_after_the_undo():
    from baton.backends.lightning.patches import LightningLogFastPath
    from baton.core.patches import PatchRecorder

    original = pl.LightningModule.log
    recorder = PatchRecorder()
    LightningLogFastPath().apply(None, recorder)  # type: ignore[arg-type]
    assert pl.LightningModule.log is not original
    assert getattr(pl.LightningModule.log, "__baton_fast_path__", False)
    assert recorder.undo() == []
    assert pl.LightningModule.log is original
