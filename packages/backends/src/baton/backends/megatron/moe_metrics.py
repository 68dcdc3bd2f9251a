"""The mixture-of-experts metrics of a Megatron-Core model, per optimizer step, as device
tensors (no host sync; the driver fetches them on log steps).

- ``moe/aux_loss``: the load-balancing loss as Megatron adds it to the gradient: its
  router records each layer's ``aux_loss / moe_aux_loss_coeff`` per micro-batch in
  Megatron's MoE metrics tracker (``get_moe_metrics_tracker``); here the coefficient
  times their sum over MoE layers, averaged over micro-batches and data-parallel ranks
  (Megatron's own ``tracker.report`` prints the mean over layers instead).
- ``moe/z_loss``: the router z-loss the same way, where ``moe_z_loss_coeff`` is set.
- ``moe/load_balance``: from each router's ``routing_map`` (a forward hook counts the
  tokens each expert receives in training): busiest expert over mean, largest over
  layers, all micro-batches and ranks together.
- ``moe/dropped_fraction``: with ``moe_expert_capacity_factor``, the share of the
  ``tokens x top-k`` routed slots the capacity dropped.

All ranks add their values in one ``all_reduce`` per step (the step's loss takes one
too); token counts are ratios, so ranks holding the same tokens (tensor parallelism
without sequence parallelism) change nothing.

Example::

    moe = MoeMetrics(backend.chunks)
    moe.begin_step()
    ...  # Megatron's forward-backward schedule
    metrics.update(moe.step_metrics(num_microbatches, data_parallel=2))
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from baton.backends.megatron.hf import gpt_model


class MoeMetrics:
    """Token counts of every router of this rank's model chunks, and the step's MoE
    metrics from them and from Megatron's tracker."""

    def __init__(self, chunks: list[Any]) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        config = gpt_model(chunks[0]).config
        self.config = config
        layers, experts = config.num_layers, config.num_moe_experts
        device = next(gpt_model(chunks[0]).parameters()).device
        #: tokens each expert received, per global layer, this step
        self.counts = torch.zeros(layers, experts, device=device)
        #: routed slots (tokens x top-k) per global layer, this step
        self.slots = torch.zeros(layers, device=device)
        self._hooks = [
            module.register_forward_hook(self._count)
            for chunk in chunks
            for module in gpt_model(chunk).modules()
            if isinstance(module, TopKRouter)
        ]

    def _count(self, router: Any, _inputs: Any, output: Any) -> None:
        if not router.training:
            return
        _probs, routing_map = output  # [tokens, experts], after any capacity drop
        layer = router.layer_number - 1
        self.counts[layer] += routing_map.sum(0)
        self.slots[layer] += routing_map.shape[0] * router.topk

    def begin_step(self) -> None:
        """Forget the previous step (Megatron's tracker accumulates until cleared)."""
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

        get_moe_metrics_tracker().clear()
        self.counts.zero_()
        self.slots.zero_()

    def step_metrics(
        self, num_microbatches: int, *, data_parallel: int, tensor_parallel: int
    ) -> dict[str, torch.Tensor]:
        """This step's ``moe/*`` metrics (0-d device tensors), every rank's counted."""
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

        tracked = get_moe_metrics_tracker().metrics
        zeros = torch.zeros_like(self.slots)
        aux = tracked["load_balancing_loss"].values if "load_balancing_loss" in tracked else zeros
        z = tracked["z_loss"].values if "z_loss" in tracked else zeros
        values = torch.cat([aux.sum()[None], z.sum()[None], self.counts.flatten(), self.slots])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(values)
        cfg = self.config
        counts = values[2 : 2 + self.counts.numel()].view_as(self.counts)
        slots = values[2 + self.counts.numel() :]
        ratio = counts.max(1).values / counts.mean(1).clamp(min=1e-9)
        metrics = {
            "moe/aux_loss": values[0] * cfg.moe_aux_loss_coeff / num_microbatches / data_parallel,
            "moe/load_balance": torch.where(slots > 0, ratio, 0.0).max(),
        }
        if cfg.moe_z_loss_coeff is not None:  # averaged by Megatron over TP and DP ranks
            scale = cfg.moe_z_loss_coeff / num_microbatches / (data_parallel * tensor_parallel)
            metrics["moe/z_loss"] = values[1] * scale
        if cfg.moe_expert_capacity_factor is not None:
            metrics["moe/dropped_fraction"] = 1 - counts.sum() / slots.sum().clamp(min=1)
        return metrics

    def close(self) -> None:
        """Remove the routers' hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
