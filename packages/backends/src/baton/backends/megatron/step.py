"""Megatron's forward step and loss for GPT, as its schedules call them once per
micro-batch.

Example::

    from megatron.core.pipeline_parallel import get_forward_backward_func

    reduced = get_forward_backward_func()(forward_step_func=gpt_forward_step, ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch


def gpt_loss(
    loss_mask: torch.Tensor, output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's three-value loss: summed token losses, token count, and a (sum, count)
    pair for reporting (a copy: the schedule divides the first value in place)."""
    losses = output.float().view(-1)
    mask = loss_mask.view(-1).float()
    total = torch.sum(losses * mask)
    count = mask.sum().to(torch.int)
    return total, count, {"lm loss": torch.stack([total.detach().clone(), count.float()])}


def gpt_forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: Any) -> Any:
    """The ``forward_step_func`` Megatron's schedules call once per micro-batch."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(gpt_loss, batch["loss_mask"])
