"""Megatron's forward step on packed post-training rows (``packed_data.PackedRows``), with
the loss functions of SFT and DPO its schedules call once per micro-batch.

Documents never see each other: positions restart per document (``position_ids``) and
the attention mask is block-causal over ``segments``, an explicit ``[b, 1, s, s]`` mask
(True: masked, Megatron's convention) that Megatron's local attention applies. Rotary
embeddings (Llama, Qwen3) rotate by the row position, which inside one document differs
from the document position by a constant: their attention scores depend only on the
distance between two tokens, so within the block-causal mask they are those of the
restarted positions. With Transformer Engine on a GPU the same rows would go as THD
``PackedSeqParams`` (``cu_seqlens`` from ``segments``, no mask); that path is not built
here, because it cannot be run without Transformer Engine.

Post-training runs set Megatron's ``calculate_per_token_loss``: a loss function returns
(sum, count) and Megatron adds the counts of every micro-batch and data-parallel rank
and divides the gradients by that global count in ``finalize_model_grads``. SFT's sum is
over supervised tokens; DPO's over pairs.

Example::

    step = partial(packed_forward_step, sft_loss)
    reduced = run_schedule(chunks, streams, config, num_microbatches=2,
                           forward_only=False, forward_step=step)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from baton.backends.megatron.step import gpt_loss, on_model_device

#: a loss function on a packed micro-batch and the model's per-token losses
PackedLoss = Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[Any, Any, Any]]


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True where query ``i`` may NOT see key ``j``: it may iff
    ``j <= i`` and both are in the same document (``segments`` equal and > 0)."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return ~(same & (segments[:, None, :] > 0) & causal)[:, None]


def packed_forward_step(
    loss: PackedLoss, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
) -> Any:
    """The ``forward_step_func`` of a packed micro-batch (bind ``loss`` first): Megatron's
    per-token losses of the labels under the block-causal mask, then ``loss``. The
    micro-batch moves to the model's device."""
    batch = on_model_device(next(data_iterator), model)
    output = model(
        batch["tokens"],
        batch["position_ids"],
        block_causal_mask(batch["segments"]),
        labels=batch["labels"],
    )
    return output, partial(loss, batch)


def sft_loss(
    batch: dict[str, torch.Tensor], output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Cross entropy summed over the supervised targets, and their count."""
    return gpt_loss(batch["loss_mask"], output)


def document_logps(
    batch: dict[str, torch.Tensor], output: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps, counts)``, each ``[b, max_documents_per_row]``: per document, the sum of
    the log-probabilities of its supervised targets (minus Megatron's per-token losses)
    and their number."""
    from baton.backends import torch_objectives as objectives

    mask = batch["loss_mask"].to(dtype)
    logps = -output.to(dtype).view(mask.shape) * mask
    segments, documents = batch["segments"], batch["documents"].shape[1]
    return (
        objectives.segment_sums(logps, segments, documents),
        objectives.segment_sums(mask, segments, documents),
    )


def dpo_loss(
    batch: dict[str, torch.Tensor], output: torch.Tensor, *, beta: float, kind: str
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's loss summed over the micro-batch's pairs, their count, and for reporting
    ``lm loss`` (sum, count) and ``dpo``: TRL's metrics (``DPO_METRICS``) summed over the
    pairs, then the count. Each row holds whole pairs: chosen, rejected, chosen..."""
    from baton.backends import torch_objectives as objectives

    logps, counts = document_logps(batch, output)
    documents = batch["documents"]
    losses, sums = objectives.pair_losses(
        logps, counts, batch["reference_logps"], documents, beta=beta, loss_type=kind
    )
    total = losses.sum()
    pairs = torch.tensor(losses.numel(), dtype=torch.int)
    count = torch.tensor(float(losses.numel()), device=total.device)
    metrics = torch.stack([*(sums[name].float() for name in objectives.DPO_METRICS), count])
    return total, pairs, {"lm loss": torch.stack([total.detach().clone(), count]), "dpo": metrics}


def reference_logps_loss(
    batch: dict[str, torch.Tensor], output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A forward-only pass's "loss": each document's log-probability sum (float64) beside
    its global sequence index, for ``reference.compute_reference_logps``."""
    logps, _ = document_logps(batch, output.detach(), torch.float64)
    zero = torch.zeros((), device=output.device)
    return zero, torch.zeros((), dtype=torch.int), {"documents": batch["documents"], "logps": logps}
