"""The Fabric backend's evaluation: each metric's mean over the evaluation batches,
averaged over ranks, with the model in eval mode and the training random state left
as it was.

Example (what ``FabricBackend.evaluate`` does)::

    means = evaluate_batches(fabric, model, eval_loader, values_of, limit=20)
    # {"loss": tensor(2.31), "accuracy": tensor(0.41)}: device tensors, fetched later

``values_of(batch)`` gives one batch's metrics (the loss first, then whatever else the
step function returns); ``limit`` caps the number of batches (``None``: all). With
``weight_of(batch)`` (a backend's ``mean_over``: a batch's supervised tokens or pairs)
each batch's means count by their weight, so the result is the mean over every item of
the evaluation data (a post-training run's held-out rows), however they are batched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def evaluate_batches(
    fabric: Any,
    model: nn.Module,
    batches: Iterable[Any],
    values_of: Callable[[Any], dict[str, Any]],
    limit: int | None = None,
    weight_of: Callable[[Any], float] | None = None,
) -> dict[str, torch.Tensor]:
    """The mean of each metric ``values_of`` returns over ``batches`` (at most ``limit``),
    averaged over ranks (weighted by ``weight_of(batch)`` where given). Evaluation draws
    no training randomness (a loader's seed, dropout): the random state is forked and
    restored."""
    sums: dict[str, torch.Tensor] = {}
    count, weights = 0, 0.0
    model.eval()
    cuda = [fabric.device] if fabric.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            for index, batch in enumerate(batches):
                if limit is not None and index >= limit:
                    break
                weight = 1.0 if weight_of is None else float(weight_of(batch))
                for key, value in values_of(fabric.to_device(batch)).items():
                    value = torch.as_tensor(value, device=fabric.device).float() * weight
                    sums[key] = sums[key] + value if key in sums else value
                count += 1
                weights += weight
    finally:
        model.train()
    if count == 0:
        raise ValueError("the evaluation data yielded no batch: it is empty")
    if weight_of is None:
        means = {key: total / count for key, total in sums.items()}
        if fabric.world_size > 1:
            means = {k: fabric.all_reduce(v, reduce_op="mean") for k, v in means.items()}
        return means
    total = torch.tensor(weights, device=fabric.device)
    if fabric.world_size > 1:
        sums = {key: fabric.all_reduce(value, reduce_op="sum") for key, value in sums.items()}
        total = fabric.all_reduce(total, reduce_op="sum")
    return {key: value / total.clamp(min=1e-12) for key, value in sums.items()}
