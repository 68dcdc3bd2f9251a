"""Read the loss and grad norm that TorchTitan's ``train_step`` computes, without a sync.

``Trainer.train_step`` keeps its loss only on steps where ``metrics.log_freq`` says to
log, and then calls ``.item()`` on it; the grad norm is a local variable. To hand
baton lazy device values on every step without changing that cadence, this module
intercepts two calls, narrowly:

- ``trainer.forward_backward_step`` is wrapped on the instance (not the class): the
  wrapper sums the detached per-microbatch losses on the device, exactly as
  ``train_step`` builds its ``accumulated_loss`` (clone of the first, ``add_`` of the
  rest; the clone also survives CUDA-graph replays).
- ``torchtitan.distributed.utils.clip_grad_norm_`` is swapped only for the duration
  of one ``train_step`` call (``with capture.step():``) and restored in ``finally``;
  the wrapper keeps the returned norm tensor. Before clipping it calls ``before_clip``
  when set (``model_state``: frozen gradients dropped, gradient watchers called).

Nothing calls ``.item()``; the values stay on the device until baton's log step.

Example::

    capture = StepCapture(trainer)
    with capture.step():
        trainer.train_step(batches)
    capture.loss, capture.grad_norm      # device tensors (rank-local loss sum)
    capture.remove()
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


class StepCapture:
    """Captures ``train_step``'s rank-local loss sum and its grad norm as device tensors."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.loss: torch.Tensor | None = None
        self.grad_norm: torch.Tensor | None = None
        #: called just before clipping, after backward (the ``model_state`` hook), if set
        self.before_clip: Callable[[], None] | None = None
        self._forward_backward = trainer.forward_backward_step
        self._dist_utils = sys.modules["torchtitan.distributed.utils"]
        trainer.forward_backward_step = self._capture_forward_backward

    def _capture_forward_backward(self, **kwargs: Any) -> torch.Tensor:
        loss = self._forward_backward(**kwargs)
        detached = loss.detach()
        if self.loss is None:
            self.loss = detached.clone()
        else:
            self.loss.add_(detached)
        return loss

    @contextmanager
    def step(self) -> Iterator[StepCapture]:
        """Capture one ``train_step`` call."""
        self.loss = None
        self.grad_norm = None
        original = self._dist_utils.clip_grad_norm_

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> torch.Tensor:
            if self.before_clip is not None:
                self.before_clip()
            norm = original(*args, **kwargs)
            self.grad_norm = norm
            return norm

        self._dist_utils.clip_grad_norm_ = clip_grad_norm_
        try:
            yield self
        finally:
            self._dist_utils.clip_grad_norm_ = original

    def remove(self) -> None:
        """Take the instance wrapper off the trainer."""
        if vars(self.trainer).get("forward_backward_step") == self._capture_forward_backward:
            del self.trainer.forward_backward_step
