"""The Megatron backend's evaluation: the token-mean loss over the first
``config.data.eval_micro_batches`` micro-batches of the validation split, forward only,
with every model chunk in eval mode (back in train mode afterwards).

Example (what ``MegatronBackend.evaluate`` does)::

    evaluate_loss(backend.chunks, backend.valid_dataset, backend.config, device)
    # {"loss": tensor(2.31)}: a device tensor, fetched later
"""

from __future__ import annotations

from typing import Any

import torch

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.step import mean_loss, run_schedule
from baton.backends.megatron.training_data import streams_over


@torch.no_grad()
def evaluate_loss(
    chunks: list[Any], valid_dataset: Any, config: MegatronConfig, device: torch.device
) -> dict[str, torch.Tensor]:
    """``{"loss": ...}`` over the validation split's first micro-batches; a
    ``RuntimeError`` when the split has no validation share."""
    if valid_dataset is None or len(valid_dataset) == 0:
        raise RuntimeError("no validation split: set config.data.split with a valid share")
    streams = streams_over(valid_dataset, config, len(chunks))
    for chunk in chunks:
        chunk.eval()
    try:
        reduced = run_schedule(
            chunks,
            streams,
            config,
            num_microbatches=config.data.eval_micro_batches,
            forward_only=True,
        )
    finally:
        for chunk in chunks:
            chunk.train()
    return {"loss": mean_loss(reduced, device)}
