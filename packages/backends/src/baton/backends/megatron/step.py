"""Megatron's forward step and loss for GPT, as its schedules call them once per
micro-batch, the schedule over a step's micro-batches, and the loss it reports.

Example::

    reduced = run_schedule(chunks, streams, config, num_microbatches=4, forward_only=False)
    loss = mean_loss(reduced, device)   # token mean over micro-batches and ranks
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def on_model_device(
    batch: dict[str, torch.Tensor], model: Any, *, non_blocking: bool = True
) -> dict[str, torch.Tensor]:
    """``batch`` on the device of ``model``'s parameters (the streams read host memory;
    on a GPU the micro-batch must follow the model)."""
    device = next(model.parameters()).device
    return {key: value.to(device, non_blocking=non_blocking) for key, value in batch.items()}


def gpt_forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: Any) -> Any:
    """The ``forward_step_func`` Megatron's schedules call once per micro-batch (the
    micro-batch moved to the model's device)."""
    batch = on_model_device(next(data_iterator), model)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(gpt_loss, batch["loss_mask"])


def run_schedule(
    chunks: list[Any],
    streams: list[Any],
    config: Any,
    *,
    num_microbatches: int,
    forward_only: bool,
    forward_step: Callable[..., Any] = gpt_forward_step,
) -> list[dict[str, torch.Tensor]]:
    """Megatron's schedule (no pipelining, 1F1B or interleaved, as the parallel state
    says) over ``num_microbatches`` micro-batches: one stream per model chunk, each
    micro-batch run by ``forward_step`` (pretraining's by default; ``posttrain_step``
    has SFT's and DPO's). Returns the last pipeline stage's reduced losses (``[]`` on
    other stages)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=streams if len(streams) > 1 else streams[0],
        model=chunks,
        num_microbatches=num_microbatches,
        seq_length=config.seq_len,
        micro_batch_size=config.micro_batch_size,
        decoder_seq_length=config.seq_len,
        forward_only=forward_only,
    )


def mean_loss(reduced: list[dict[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """Token-mean loss over micro-batches, pipeline stages and data-parallel ranks
    (stays on ``device``)."""
    pair = global_sums(reduced, "lm loss", 2, device)
    return pair[0] / pair[1].clamp(min=1)


def global_sums(
    reduced: list[dict[str, torch.Tensor]], key: str, size: int, device: torch.device
) -> torch.Tensor:
    """The ``size`` sums each micro-batch reported under ``key``, summed over the step's
    micro-batches, pipeline stages (only the last reports) and data-parallel ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if reduced:
        sums = torch.stack([r[key] for r in reduced]).sum(0)
    else:  # not the last pipeline stage: contributes nothing
        sums = torch.zeros(size, device=device)
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(sums, group=parallel_state.get_pipeline_model_parallel_group())
    if parallel_state.get_data_parallel_world_size() > 1:
        dist.all_reduce(sums, group=parallel_state.get_data_parallel_group())
    return sums
