"""``moe/load_balance`` of a TorchTitan mixture-of-experts model, lazily.

A forward pre-hook on each of TorchTitan's ``RoutedExperts`` adds the router's tokens
per expert (the ``num_local_tokens_per_expert_E`` that ``MoE.forward`` hands it) into
one device tensor per layer for the step (every microbatch; an activation-checkpointing
recompute counts a token twice, which leaves the ratio unchanged). Nothing else runs on
a step: the step's :class:`ExpertCounts` is a lazy value, reduced only when baton logs
(``TorchTitanBackend.fetch``): the counts summed over the data-parallel ranks, the
busiest expert over the mean per layer, the largest over the layers (and over the
pipeline stages, each holding its own layers).

TorchTitan's router is dropless (no capacity factor on its CPU all-to-all and local
dispatchers) and its Qwen3-MoE adds no auxiliary or z loss to the loss, so there is no
``moe/dropped_fraction``, ``moe/aux_loss`` or ``moe/z_loss`` to report.

Example::

    load = ExpertLoad.attach(trainer.model_parts)    # None for a model without experts
    load.start_step()
    trainer.train_step(batches)
    metrics["moe/load_balance"] = load.step_counts() # ExpertCounts, reduced on log steps
    load.remove()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ExpertCounts:
    """One step's tokens per expert of each MoE layer on this rank (device tensors)."""

    per_layer: list[torch.Tensor]

    def load_balance(self, parallel_dims: Any) -> torch.Tensor:
        """Busiest expert over mean tokens per expert, the largest over MoE layers, over
        every rank's tokens (a collective on the loss and pipeline meshes)."""
        from torchtitan.distributed import utils as dist_utils

        counts = torch.stack([_full(count).float() for count in self.per_layer])
        if parallel_dims.dp_cp_enabled:
            counts = dist_utils.dist_sum_tensor(counts, parallel_dims.get_optional_mesh("loss"))
        ratio = (counts.max(dim=1).values / counts.mean(dim=1).clamp_min(1e-12)).max()
        if parallel_dims.pp_enabled:
            group = parallel_dims.get_mesh("pp").get_group()
            torch.distributed.all_reduce(ratio, op=torch.distributed.ReduceOp.MAX, group=group)
        return ratio


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value; a plain tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


class ExpertLoad:
    """Counts the tokens routed to each expert of every MoE layer, one step at a time."""

    def __init__(self, routed_experts: list[torch.nn.Module]) -> None:
        self._counts: dict[int, torch.Tensor] = {}
        self._order = [id(module) for module in routed_experts]
        self._hooks = [module.register_forward_pre_hook(self._count) for module in routed_experts]

    @classmethod
    def attach(cls, model_parts: list[torch.nn.Module]) -> ExpertLoad | None:
        """Hooks on every ``RoutedExperts`` of ``model_parts``; ``None`` when there are none."""
        from torchtitan.models.common.moe import RoutedExperts

        found = [m for part in model_parts for m in part.modules() if isinstance(m, RoutedExperts)]
        return cls(found) if found else None

    def _count(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        tokens_per_expert = args[3].detach()
        held = self._counts.get(id(module))
        self._counts[id(module)] = tokens_per_expert if held is None else held + tokens_per_expert

    def start_step(self) -> None:
        """Forget the last step's counts."""
        self._counts = {}

    def step_counts(self) -> ExpertCounts | None:
        """This step's counts, layer by layer (``None`` before any forward)."""
        counts = [self._counts[key] for key in self._order if key in self._counts]
        return ExpertCounts(counts) if counts else None

    def remove(self) -> None:
        """Take the hooks off."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
