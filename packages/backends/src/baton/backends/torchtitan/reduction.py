"""Values a TorchTitan step returns that become global only when fetched (log steps,
on every rank at the same step): a rank-local loss, the experts' token counts and an
objective's metrics.

Example (what ``TorchTitanBackend.train_step`` and ``fetch`` do)::

    loss = RankLocal(capture.loss)                 # on a data/context/pipeline-parallel run
    metrics = {"rewards/chosen": MetricMean(sums, 0), "rewards/rejected": MetricMean(sums, 1)}
    values = global_values({"loss": loss, **metrics}, trainer)   # one reduction of sums
    torch_distributed.fetch(values, prepare=full_tensor)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from baton.backends.torchtitan.moe_metrics import ExpertCounts


@dataclass
class RankLocal:
    """A per-rank loss whose global value is a sum over the loss mesh (data and
    context parallel ranks) and, under pipeline parallelism, comes from the rank that
    holds the last stage (the others hold TorchTitan's placeholder ``-1``).

    The reduction runs in ``fetch`` (log steps only, on every rank at the same step),
    the same collective TorchTitan's ``train_step`` runs when it logs.
    """

    value: torch.Tensor


@dataclass
class MetricMean:
    """One metric of a rank-local ``[2, M]`` table of ``(sum, weight)`` pairs (column
    ``index``): its global value is the sum over the loss mesh of the sums divided by that
    of the weights. Metrics sharing a table are reduced with one collective."""

    sums: torch.Tensor
    index: int


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (its ``full_tensor()``); a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def global_value(value: Any, trainer: Any) -> Any:
    """``value`` reduced over ``trainer``'s meshes: a :class:`RankLocal` loss summed
    over the pipeline and loss meshes, :class:`ExpertCounts` as their load balance;
    anything else as it is."""
    if isinstance(value, ExpertCounts):
        return value.load_balance(trainer.parallel_dims)
    if not isinstance(value, RankLocal):
        return value
    from torchtitan.distributed import utils as dist_utils

    loss = value.value.reshape(())
    dims = trainer.parallel_dims
    if dims.pp_enabled:
        if not trainer.pp_has_last_stage:
            loss = torch.zeros_like(loss)
        loss = dist_utils.dist_sum_tensor(loss, dims.get_mesh("pp"))
    if dims.dp_cp_enabled:
        loss = dist_utils.dist_sum_tensor(loss, dims.get_optional_mesh("loss"))
    return loss


def global_values(values: Mapping[str, Any], trainer: Any) -> dict[str, Any]:
    """Each of ``values`` reduced over ``trainer``'s meshes (``global_value``); the
    :class:`MetricMean` of one table from one reduction of the table."""
    tables: dict[int, torch.Tensor] = {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, MetricMean):
            table = tables.get(id(value.sums))
            if table is None:
                table = tables[id(value.sums)] = _summed(value.sums, trainer)
            out[key] = table[0, value.index] / table[1, value.index].clamp(min=1e-12)
        else:
            out[key] = global_value(value, trainer)
    return out


def _summed(table: torch.Tensor, trainer: Any) -> torch.Tensor:
    """``table`` summed over the loss mesh (data and context parallel ranks)."""
    from torchtitan.distributed import utils as dist_utils

    dims = trainer.parallel_dims
    if not dims.dp_cp_enabled:
        return table
    return dist_utils.dist_sum_tensor(table, dims.get_optional_mesh("loss"))


def model_parameters(trainer: Any) -> int:
    """The whole model's parameter count on every rank (call it on every rank at once):
    a DTensor counts its global size, and under pipeline parallelism each stage's count
    is summed over the stages (a stage holds only its own layers)."""
    count = sum(p.numel() for part in trainer.model_parts for p in part.parameters())
    dims = trainer.parallel_dims
    if not dims.pp_enabled:
        return count
    import torch.distributed as dist

    total = torch.tensor(count, dtype=torch.int64, device=trainer.device)
    dist.all_reduce(total, group=dims.get_mesh("pp").get_group())
    return int(total.item())
