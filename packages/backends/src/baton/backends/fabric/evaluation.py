"""The Fabric backend's evaluation: each metric's mean over the evaluation batches,
averaged over ranks, with the model in eval mode and the training random state left
as it was.

Example (what ``FabricBackend.evaluate`` does)::

    means = evaluate_batches(fabric, model, eval_loader, values_of, limit=20)
    # {"loss": tensor(2.31), "accuracy": tensor(0.41)}: device tensors, fetched later

``values_of(batch)`` gives one batch's metrics (the loss first, then whatever else the
step function returns); ``limit`` caps the number of batches (``None``: all). With
``weight_of(batch)`` (a backend's ``mean_over``: the items of the objective's loss in a
batch) each batch's mean loss counts by its items and each ``WeightedMean`` metric adds
its own total and weight, so the result is the objective's loss over every held-out row
(the sum of its totals over the sum of its items) and each metric its sum over its
weight, however the rows are batched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from baton.backends.fabric.step import WeightedMean


def evaluate_batches(
    fabric: Any,
    model: nn.Module,
    batches: Iterable[Any],
    values_of: Callable[[Any], dict[str, Any]],
    limit: int | None = None,
    weight_of: Callable[[Any], float] | None = None,
) -> dict[str, torch.Tensor]:
    """The mean of each metric ``values_of`` returns over ``batches`` (at most ``limit``),
    averaged over ranks: each batch's value weighted by ``weight_of(batch)`` where given
    (a ``WeightedMean`` then adds its own total and weight), else one batch one vote (a
    ``WeightedMean`` as its batch's mean). Evaluation draws no training randomness (a
    loader's seed, dropout): the random state is forked and restored."""
    sums: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    count = 0
    model.eval()
    cuda = [fabric.device] if fabric.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            for index, batch in enumerate(batches):
                if limit is not None and index >= limit:
                    break
                weight = 1.0 if weight_of is None else float(weight_of(batch))
                for key, value in values_of(fabric.to_device(batch)).items():
                    if isinstance(value, WeightedMean) and weight_of is None:
                        value = value.value()
                    if isinstance(value, WeightedMean):
                        total, part = _tensor(value.total, fabric), _tensor(value.weight, fabric)
                    else:
                        total = _tensor(value, fabric) * weight
                        part = torch.tensor(weight, device=fabric.device)
                    sums[key] = sums[key] + total if key in sums else total
                    weights[key] = weights[key] + part if key in weights else part
                count += 1
    finally:
        model.train()
    if count == 0:
        raise ValueError("the evaluation data yielded no batch: it is empty")
    if weight_of is None:
        means = {key: total / count for key, total in sums.items()}
        if fabric.world_size > 1:
            means = {k: fabric.all_reduce(v, reduce_op="mean") for k, v in means.items()}
        return means
    if fabric.world_size > 1:
        sums = {key: fabric.all_reduce(value, reduce_op="sum") for key, value in sums.items()}
        weights = {key: fabric.all_reduce(value, reduce_op="sum") for key, value in weights.items()}
    return {key: value / weights[key].clamp(min=1e-12) for key, value in sums.items()}


def _tensor(value: Any, fabric: Any) -> torch.Tensor:
    return torch.as_tensor(value, device=fabric.device).float()
