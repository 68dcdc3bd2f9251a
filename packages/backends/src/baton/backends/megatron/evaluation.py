"""The Megatron backend's evaluation: the token-mean loss over the first
``config.data.eval_micro_batches`` micro-batches of the validation split, forward only,
with every model chunk in eval mode (back in train mode afterwards); for SFT and DPO the
objective's loss over every held-out row (``held_out_metrics``: each document's
log-probability sum by the forward-only pass DPO's reference takes, then
``baton.backends.posttrain_evaluation``).

Example (what ``MegatronBackend.evaluate`` does)::

    evaluate_loss(backend.chunks, backend.valid_dataset, backend.config, device)
    # {"loss": tensor(2.31)}: a device tensor, fetched later
    held_out_metrics(backend.chunks, held_rows, backend.config, device)
    # {"loss": 4.1, "rewards/accuracies": 0.5, ...} (DPO)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.step import mean_loss, run_schedule
from baton.backends.megatron.training_data import streams_over
from baton.data import DataError


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


def held_out_split(eval_split: float) -> str:
    """Megatron's ``split`` (train, valid, test shares of the documents) holding out the
    last ``eval_split`` of each dataset's documents for validation: Megatron's builder
    then gives validation documents ``N - round(eval_split * N)`` to ``N``, the rule of
    every engine (``baton.data.held_out_start``)::

        config.data.split = held_out_split(0.05)     # "0.95,0.05,0"
    """
    if not 0 <= eval_split < 1:
        raise DataError(f"--eval-split {eval_split} is not in [0, 1); pass e.g. --eval-split 0.05")
    return f"{1 - eval_split:g},{eval_split:g},0"


def held_out_metrics(
    chunks: list[Any], held: Any, config: MegatronConfig, device: torch.device
) -> dict[str, float]:
    """The objective's loss (and DPO's metrics) over every held-out row of ``held``
    (``packed_data.PackedRows`` of the rows held out, with their reference for DPO)."""
    from megatron.core import parallel_state

    from baton.backends.megatron.reference import compute_reference_logps
    from baton.backends.posttrain_evaluation import evaluation_metrics

    if held is None:
        raise RuntimeError("no validation split: hold rows out with --eval-split F")
    ranks = parallel_state.get_data_parallel_world_size()
    micro = max(1, min(config.micro_batch_size, len(held) // ranks))  # few held-out rows
    passes = replace(config, micro_batch_size=micro)
    logps = compute_reference_logps(chunks, held, passes, device)  # the weights as they are
    return evaluation_metrics(
        held.data, logps, objective=config.objective, reference=held.reference,
        beta=config.dpo_beta, loss_type=config.dpo_loss,
    )  # fmt: skip
