"""The expert load of a MaxText mixture-of-experts step, as the standard metrics
``moe/load_balance`` and ``moe/dropped_fraction``, computed inside MaxText's own jitted
``train_step``.

MaxText's router reports no expert load on its dense (CPU) path, so the patch
:class:`MaxTextMoeLoadMetrics` (a run of a model with experts only; undone on teardown)
wraps two of its functions:

- ``RoutedMoE.get_topk`` keeps as intermediates, per MoE layer, the busiest expert's routed token slots
  over the mean per expert (``baton_load_ratio``) and the fraction of slots past each
  expert's capacity (``baton_dropped_fraction``), counted as MaxText's ``generate_masks``
  drops them: per sequence, in token order, capacity ``max(ceil(seq * k / experts) *
  capacity_factor, capacity_factor)``; 0 without a capacity factor (dropless);
- ``record_activation_metrics``, the hook ``train_step`` calls with the
  intermediates when ``record_internal_nn_metrics`` is on (set by the patch; MaxText's
  Qwen3 layers sow nothing else for it), adds ``moe/load_balance`` (the largest ratio
  over the layers) and ``moe/dropped_fraction`` (the mean over the layers, each the
  same number of slots) to the step's scalars.

The values are device scalars of the step's output, read on log steps only. They cost
a one-hot count of the routed slots per layer (``batch * seq * k * experts``
integers), small beside the experts' matmuls.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from baton.core.patches import Patch, PatchRecorder, register_patch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView


def expert_load(indices: Any, num_experts: int, capacity_factor: float) -> tuple[Any, Any]:
    """The busiest expert's slots over the mean, and the dropped fraction of the slots,
    of one layer's top-k expert ``indices`` (``[batch, seq, k]``)."""
    import jax
    import jax.numpy as jnp

    batch, seq, top_k = indices.shape
    slots = jax.nn.one_hot(indices.reshape(batch, seq * top_k), num_experts, dtype=jnp.int32)
    per_expert = slots.sum(axis=(0, 1))
    ratio = per_expert.max() / (batch * seq * top_k / num_experts)
    if capacity_factor <= 0:
        return ratio, jnp.zeros((), jnp.float32)
    capacity = int(max(math.ceil(seq * top_k / num_experts) * capacity_factor, capacity_factor))
    position = jnp.cumsum(slots, axis=1) * slots  # 1-based place in its expert's queue
    dropped = (position > capacity).sum() / (batch * seq * top_k)
    return ratio, dropped.astype(jnp.float32)


def add_load_metrics(scalars: dict[str, Any], intermediate_outputs: Any) -> None:
    """``moe/load_balance`` and ``moe/dropped_fraction`` from the per-layer intermediates."""
    import jax.numpy as jnp
    from maxtext.utils import maxtext_utils

    ratios = maxtext_utils.collect_intermediates_by_suffix(intermediate_outputs, "baton_load_ratio")
    if not ratios:
        return
    dropped = maxtext_utils.collect_intermediates_by_suffix(
        intermediate_outputs, "baton_dropped_fraction"
    )
    scalars["moe/load_balance"] = jnp.max(jnp.concatenate(ratios))
    scalars["moe/dropped_fraction"] = jnp.mean(jnp.concatenate(dropped))


@register_patch
class MaxTextMoeLoadMetrics(Patch):
    """Log the expert load (``moe/load_balance``, ``moe/dropped_fraction``) of a MaxText
    model with experts, from inside its own ``train_step``."""

    name = "maxtext_moe_load_metrics"
    backend = "maxtext"
    versions = ">=0.2.5,<0.3"
    phase = "configure"

    def condition(self, backend: Backend) -> bool | tuple[bool, str]:
        overrides = getattr(backend.config, "overrides", {}) or {}
        experts = int(overrides.get("num_experts", 1))
        if experts <= 1:
            return False, "no experts (num_experts <= 1)"
        return True, f"num_experts={experts}"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        from flax import nnx
        from maxtext.layers.moe import RoutedMoE
        from maxtext.trainers.pre_train import train

        get_topk, record = RoutedMoE.get_topk, train.record_activation_metrics

        @functools.wraps(get_topk)
        def get_topk_sowing(self: Any, *args: Any, **kwargs: Any) -> Any:
            weights, indices = get_topk(self, *args, **kwargs)
            if self.config.model_call_mode != "inference":
                factor = float(self.config.capacity_factor)
                ratio, dropped = expert_load(indices, self.num_experts, factor)
                # as MaxText's layers keep moe_lb_loss (one value a call)
                self.baton_load_ratio = nnx.Intermediate(ratio)
                self.baton_dropped_fraction = nnx.Intermediate(dropped)
            return weights, indices

        @functools.wraps(record)
        def record_with_load(output_metrics: Any, intermediate_outputs: Any, config: Any) -> None:
            record(output_metrics, intermediate_outputs, config)
            add_load_metrics(output_metrics["scalar"], intermediate_outputs)

        recorder.setattr(RoutedMoE, "get_topk", get_topk_sowing)
        recorder.setattr(train, "record_activation_metrics", record_with_load)
        recorder.setitem(driver.backend.config.overrides, "record_internal_nn_metrics", True)
