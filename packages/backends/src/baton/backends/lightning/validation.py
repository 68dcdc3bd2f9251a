"""``Trainer``'s validation loop for ``LightningLoop``: the module's and callbacks'
validation hooks in the Trainer's order, ``self.log`` through Lightning's result
collection, the module's train/eval modes restored after it, and the random state a
sanity check leaves alone.

Example (what ``LightningLoop.validate`` and its sanity check do)::

    logged = validate(loop, limit=20)                  # {"val_loss": tensor(2.31), ...}
    with isolated_rng(device):                         # the sanity check draws nothing
        validate(loop, 2, stage="sanity_check")
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch


class ValidatingLoop(Protocol):
    """What validation reads of ``loop.LightningLoop``."""

    trainer: Any
    module: Any
    model: Any
    eval_data: Any

    @property
    def fabric(self) -> Any: ...

    def hook(self, name: str, *args: Any) -> Any: ...

    def module_hook(self, name: str, *args: Any, **kwargs: Any) -> Any: ...


def validate(loop: ValidatingLoop, limit: int | None, stage: str = "validate") -> dict[str, Any]:
    """The validation loop over ``loop``'s evaluation data (at most ``limit`` batches):
    the epoch-level values the module logged (``self.log`` in ``validation_step`` or
    ``on_validation_epoch_end``)."""
    trainer = loop.trainer
    connector = trainer._logger_connector
    first_loop_iter = connector._first_loop_iter
    trainer.stage = stage
    try:
        if stage == "validate":
            loop.module_hook("on_validation_model_zero_grad")
        with torch.inference_mode():  # the Trainer's whole validation loop
            logged = _validation_epoch(loop, loop.eval_data, limit)
    finally:
        trainer.stage = "train"
        connector._first_loop_iter = first_loop_iter
    return logged


def _validation_epoch(loop: ValidatingLoop, data: Any, limit: int | None) -> dict[str, Any]:
    module = loop.module
    connector = loop.trainer._logger_connector
    modes = {name: m.training for name, m in module.named_modules()}
    loop.module_hook("on_validation_model_eval")
    loop.hook("on_validation_start")
    loop.hook("on_validation_epoch_start")
    for batch_idx, batch in enumerate(data):
        if limit is not None and batch_idx >= limit:
            break
        _validation_batch(loop, batch, batch_idx)
    connector.epoch_end_reached()
    logged = dict(connector.update_eval_epoch_metrics())
    connector.epoch_end_reached()
    connector._evaluation_epoch_end()
    loop.hook("on_validation_epoch_end")
    connector.on_epoch_end()
    logged.update(connector.update_eval_epoch_metrics())
    loop.hook("on_validation_end")
    connector.reset_results()
    if overrides(module, "on_validation_model_train"):
        loop.module_hook("on_validation_model_train")
    else:
        for name, submodule in module.named_modules():
            submodule.train(modes.get(name, True))
    return logged


def _validation_batch(loop: ValidatingLoop, batch: Any, batch_idx: int) -> None:
    batch = loop.fabric.to_device(batch)
    connector = loop.trainer._logger_connector
    connector.on_batch_start(batch)
    loop.hook("on_validation_batch_start", batch, batch_idx)
    module = loop.module
    previous, module._current_fx_name = module._current_fx_name, "validation_step"
    try:
        output = loop.model.validation_step(batch, batch_idx)
    finally:
        module._current_fx_name = previous
    loop.hook("on_validation_batch_end", output, batch, batch_idx)
    connector.on_batch_end()


@contextmanager
def isolated_rng(device: torch.device) -> Iterator[None]:
    """Python, NumPy and torch random states restored on exit (Lightning's ``isolate_rng``)."""
    python_state = random.getstate()
    try:
        import numpy as np

        numpy_state: Any = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        np, numpy_state = None, None
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            if np is not None:
                np.random.set_state(numpy_state)


def overrides(module: Any, name: str) -> bool:
    """Whether ``module``'s class overrides the ``LightningModule`` hook ``name``."""
    import lightning.pytorch as pl

    return getattr(type(module), name, None) is not getattr(pl.LightningModule, name)
