"""The Megatron backend's evaluation: the token-mean loss over the first
``config.data.eval_micro_batches`` micro-batches of the validation split, forward only,
with every model chunk in eval mode (back in train mode afterwards); on packed rows the
objective's declared loss over every held-out row (``held_out_metrics``: the forward
step training takes, forward only, then ``baton.backends.posttrain_evaluation``).

Example (what ``MegatronBackend.evaluate`` does)::

    evaluate_loss(backend.chunks, backend.valid_dataset, backend.config, device)
    # {"loss": tensor(2.31)}: a device tensor, fetched later
    held_out_metrics(backend.chunks, held_rows, backend.config, device)
    # {"loss": 0.69, "rewards/accuracies": 0.5, ...} (DPO)
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from baton.backends.megatron.config import MegatronConfig
from baton.backends.megatron.packed_data import VALUES
from baton.backends.megatron.step import global_sums, mean_loss, run_schedule
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


class PaddedRows:
    """Held-out ``PackedRows`` up to a multiple of ``multiple`` rows, the rows past the
    last ones standing in with nothing supervised, no document and no values (they add
    nothing to any sum: ``posttrain_evaluation``), so every data-parallel rank runs whole
    micro-batches and no row is read twice."""

    def __init__(self, rows: Any, multiple: int) -> None:
        self.rows = rows
        self.size = -(-len(rows) // multiple) * multiple

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < len(self.rows):
            return self.rows[index]
        sample = dict(self.rows[0])
        sample["loss_mask"] = numpy.zeros_like(sample["loss_mask"])
        sample["documents"] = numpy.full_like(sample["documents"], -1)
        for key in [k for k in sample if k.startswith(VALUES)]:
            sample[key] = numpy.zeros_like(sample[key])
        return sample


@torch.no_grad()
def held_out_metrics(
    chunks: list[Any], held: Any, config: MegatronConfig, device: torch.device
) -> dict[str, float]:
    """The objective's loss (and its metrics) over every held-out row of ``held``
    (``packed_data.PackedRows`` of the rows held out, with their document values): a
    forward-only pass of Megatron's schedule computing the declared loss as training
    does (``objective.declared_loss_step``), each data-parallel rank its share, the sums
    reduced over micro-batches, pipeline stages and ranks, then
    ``posttrain_evaluation.evaluation_means``."""
    from megatron.core import parallel_state

    from baton.backends.megatron.objective import REPORTED, declared_loss_step
    from baton.backends.posttrain_evaluation import evaluation_means

    if held is None:
        raise RuntimeError("no held-out rows: hold rows out with --eval-split F")
    run = config.objective
    per_pass = config.micro_batch_size * parallel_state.get_data_parallel_world_size()
    rows = PaddedRows(held, per_pass)
    streams = streams_over(rows, config, len(chunks))
    for chunk in chunks:
        chunk.eval()
    try:
        reduced = run_schedule(
            chunks, streams, config, num_microbatches=len(rows) // per_pass,
            forward_only=True, forward_step=declared_loss_step(run),
        )  # fmt: skip
    finally:
        for chunk in chunks:
            chunk.train()
    sums = global_sums(reduced, REPORTED, 2 + 2 * len(run.objective.metrics), device)
    return evaluation_means(run, sums.cpu().numpy())
