"""The model's current weights as whole tensors by Hugging Face name, gathered in memory:
what a rollout phase loads into its generator before sampling (``TorchTitanBackend.
gather_weights``), with the names and shapes ``baton export`` writes.

Every rank walks the model's state dict in the same order (TorchTitan's canonical FQNs,
as its checkpoints hold them); a sharded tensor (a DTensor under FSDP, TP or EP) becomes
whole through ``full_tensor()``, a collective every rank joins. The first rank keeps a
host copy of each and maps them with the model's own state-dict adapter
(``export.to_hf_weights``: the export's mapping); the other ranks keep nothing. Pipeline
stages are not gathered (the generic objective loss refuses pipeline parallelism).

Example::

    weights = gather_hf_weights(trainer, keep=rank == 0)
    weights["model.layers.0.self_attn.q_proj.weight"].shape     # on rank 0; None elsewhere
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.torchtitan.export import to_hf_weights
from baton.core.errors import UsageError


def gather_hf_weights(trainer: Any, *, keep: bool) -> dict[str, torch.Tensor] | None:
    """``trainer``'s model weights by Hugging Face name, whole, on the host where ``keep``
    (the first rank); ``None`` elsewhere. Every rank must call it (collectives)."""
    from torch.distributed.tensor import DTensor

    if trainer.parallel_dims.pp_enabled:
        raise UsageError(
            "the policy's weights are gathered for its generator over data, tensor and "
            "expert parallel ranks, not pipeline stages; use --pp 1"
        )
    adapter = getattr(trainer.checkpointer, "sd_adapter", None)
    if adapter is None:
        raise UsageError(
            f"TorchTitan's {trainer.config.model_spec.name} has no Hugging Face state-dict "
            "adapter, so its weights have no Hugging Face names to sample with; use a "
            "llama3 or qwen3 model"
        )
    weights: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for part in trainer.model_parts:
            for name, value in part.state_dict().items():
                whole = value.full_tensor() if isinstance(value, DTensor) else value
                if keep:
                    weights[name] = whole.detach().to("cpu", copy=True)
    if not keep:
        return None
    return to_hf_weights(adapter, weights, where="the policy")
