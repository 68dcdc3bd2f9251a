"""Manual optimization (``automatic_optimization = False``) as ``Trainer.fit`` runs it.

One baton step is one batch: ``training_step`` does everything itself with
``self.optimizers()`` (Lightning's ``LightningOptimizer`` wrappers),
``self.manual_backward(loss)``, ``opt.step()``, ``opt.zero_grad()`` and
``self.toggle_optimizer(opt)``; schedulers are the module's to step. Each ``opt.step()``
counts one ``global_step``, as in the Trainer: a GAN stepping two optimizers per batch
advances ``self.global_step`` by two, so ``Trainer(max_steps=2 * N)`` is baton's
``max_steps=N``.

Example (Lightning's documented GAN step, unchanged)::

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        self.toggle_optimizer(opt_g)
        g_loss = ...
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def check_manual(config: Any) -> None:
    """The Trainer's own refusals for manual optimization, with baton's setting names."""
    if config.grad_accum != 1:
        raise ValueError(
            "manual optimization accumulates as the module's training_step decides: set "
            f"FabricConfig.grad_accum to 1 (got {config.grad_accum})"
        )
    if config.grad_clip is not None:
        raise ValueError(
            "manual optimization clips in training_step (self.clip_gradients(opt, ...)): "
            f"set FabricConfig.grad_clip to None (got {config.grad_clip})"
        )


def run_manual_batch(
    loop: Any, batch: Any, batch_idx: int
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """``training_step`` of one batch under manual optimization: the outputs
    ``on_train_batch_end`` receives, and the loss if it returned one."""

    def count_step() -> None:
        loop.global_step += 1

    for optimizer in loop.lightning_optimizers:
        optimizer._on_after_step = count_step
    previous = loop.hooks.fx_name("training_step")
    try:
        output = loop.model.training_step(batch, batch_idx)
    finally:
        loop.hooks.restore_fx_name(previous)
        for optimizer in loop.lightning_optimizers:
            optimizer._on_after_step = _nothing
    if isinstance(output, Mapping):
        outputs = dict(output)
    elif isinstance(output, torch.Tensor):
        outputs = {"loss": output}
    elif output is None:
        outputs = {}
    else:
        raise TypeError(
            "in manual optimization, training_step returns a tensor, a dict or nothing; "
            f"got {type(output).__name__}"
        )
    loss = outputs.get("loss")
    if isinstance(loss, torch.Tensor):
        outputs["loss"] = loss = loss.detach()
    return outputs, loss


def _nothing() -> None:
    return None
