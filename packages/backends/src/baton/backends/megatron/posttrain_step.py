"""Megatron's forward step on packed rows (``packed_data.PackedRows``: documents packed
into rows by ``baton data prepare --seq-len``), as its schedules call it once per
micro-batch, and the cross entropy of an objective that is Megatron's own loss.

Documents never see each other: positions restart per document (``position_ids``) and
the attention mask is block-causal over ``segments``, an explicit ``[b, 1, s, s]`` mask
(True: masked, Megatron's convention) that Megatron's local attention applies. Rotary
embeddings (Llama, Qwen3) rotate by the row position, which inside one document differs
from the document position by a constant: their attention scores depend only on the
distance between two tokens, so within the block-causal mask they are those of the
restarted positions. With Transformer Engine on a GPU the same rows would go as THD
``PackedSeqParams`` (``cu_seqlens`` from ``segments``, no mask); that path is not built
here, because it cannot be run without Transformer Engine.

The model returns Megatron's per-token cross entropy of the labels, or with
``logits=True`` its vocab-parallel logits (``[b, s, V / tp]``) for a loss that needs them
(``objective.py``). Packed rows run under Megatron's ``calculate_per_token_loss``: a loss
function returns (sum, count) and Megatron adds the counts of every micro-batch and
data-parallel rank and divides the gradients by that global count in
``finalize_model_grads``.

Example::

    step = partial(packed_forward_step, cross_entropy_loss)
    reduced = run_schedule(chunks, streams, config, num_microbatches=2,
                           forward_only=False, forward_step=step)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from baton.backends.megatron.step import gpt_loss, on_model_device

#: a loss function on a packed micro-batch and the model's output
PackedLoss = Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[Any, Any, Any]]


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True where query ``i`` may NOT see key ``j``: it may iff
    ``j <= i`` and both are in the same document (``segments`` equal and > 0)."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return ~(same & (segments[:, None, :] > 0) & causal)[:, None]


def packed_forward_step(
    loss: PackedLoss,
    data_iterator: Iterator[dict[str, torch.Tensor]],
    model: Any,
    *,
    logits: bool = False,
) -> Any:
    """The ``forward_step_func`` of a packed micro-batch (bind ``loss`` first): the model
    under the block-causal mask, returning Megatron's per-token losses of the labels, or
    its vocab-parallel logits with ``logits=True``, then ``loss``. The micro-batch moves
    to the model's device."""
    batch = on_model_device(next(data_iterator), model)
    output = model(
        batch["tokens"],
        batch["position_ids"],
        block_causal_mask(batch["segments"]),
        labels=None if logits else batch["labels"],
    )
    return output, partial(loss, batch)


def cross_entropy_loss(
    batch: dict[str, torch.Tensor], output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's cross entropy summed over the supervised targets, and their count."""
    return gpt_loss(batch["loss_mask"], output)
