"""``self.log`` repeated: a call Lightning already accepted goes straight to its update.

A module logs the same names with the same arguments at every step (``self.log("loss",
loss)`` in ``training_step``). Lightning's ``LightningModule.log`` re-checks the call each
time (the value's type, the hook's allowed levels, the name, the metadata against the one
stored) before the three things that depend on the value: the value made a detached
scalar tensor, the result collection reset where a new hook starts logging, and the
stored metric updated. Under baton's ``LightningBackend`` a call is remembered once
Lightning's own ``log`` accepted it; the same call again (same hook, name and arguments,
a scalar tensor, the same stored metric) does only those three things, with Lightning's
own functions, so what is logged is Lightning's, bit for bit. Anything else goes through
Lightning's ``log`` unchanged: other value types, a call not seen yet, a module trained by
a ``lightning.pytorch.Trainer``.

Example (what the ``lightning_log_fast_path`` patch installs for a run)::

    LightningModule.log = log_with_fast_path(LightningModule.log)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.core.module import LightningModule

from baton.backends.lightning.trainer import TrainerView

#: ``LightningModule.log``'s parameters (a remembered call's ``batch_size``)
_LOG = inspect.signature(LightningModule.log)


def log_with_fast_path(log: Callable[..., None]) -> Callable[..., None]:
    """``LightningModule.log`` (``log``) with repeated calls under a ``TrainerView`` fast."""

    @functools.wraps(log)
    def fast_log(module: Any, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        trainer = module._trainer
        if type(value) is not torch.Tensor or type(trainer) is not TrainerView:
            log(module, name, value, *args, **kwargs)
            return
        fx = module._current_fx_name
        results = trainer._results
        try:
            call = (fx, name, trainer.stage, args, tuple(kwargs.items()))
            seen = trainer._log_calls.get(call)
        except TypeError:  # an unhashable argument: not remembered
            log(module, name, value, *args, **kwargs)
            return
        if (
            seen is None
            or results.get(seen[0]) is not seen[1]
            or results.dataloader_idx is not None
            or value.numel() != 1
            or module._fabric is not None
        ):
            log(module, name, value, *args, **kwargs)
            key = f"{fx}.{name}"
            if fx is not None and results.dataloader_idx is None and key in results:
                given = _LOG.bind(module, name, value, *args, **kwargs).arguments
                trainer._log_calls[call] = (key, results[key], given.get("batch_size"))
            return
        key, metric, batch_size = seen
        value = value.clone().detach().squeeze()  # LightningModule.__to_tensor
        connector = trainer._logger_connector
        if connector.should_reset_tensors(fx):
            results.reset(metrics=False, fx=fx)
        if not metric.meta.enable_graph:
            value = value.detach()  # recursive_detach
        metric.to(value.device)
        results.update_metrics(
            key, value, results._extract_batch_size(metric, batch_size, metric.meta)
        )
        connector._current_fx = fx

    fast_log.__baton_fast_path__ = True  # type: ignore[attr-defined]
    return fast_log
