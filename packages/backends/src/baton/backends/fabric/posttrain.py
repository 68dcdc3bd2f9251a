"""Post-training on the Fabric backend with ``transformers`` models: packed rows
(``baton.data.packed``) as the model's inputs, the model's own cross entropy for the
objectives that declare it (``native_cross_entropy``: SFT), and the forward-only scorer
of a stored reference (each document's log-probability under the reference model).

Rows go to the model natively: ``input_ids`` (a row's tokens but the last),
``position_ids`` restarting at 0 in each document, no attention mask and no KV cache
(``use_cache=False``), from which ``transformers`` builds a block-causal mask (a query
never sees another document; with a cache it would not look for packed documents), and
``labels``/``shift_labels`` (the next tokens, -100 where not supervised: the model's own
loss). On the ``chunked`` and ``fused`` paths (``cross_entropy.py``) the same loss comes
without the full float32 logits. With ``FabricBackend(mean_over=ObjectiveItems(run))``
the batch also carries ``num_items_in_batch``, the global batch's supervised tokens, so
a step's loss is the mean over the global batch. Every other objective (DPO, a declared
one) goes through ``objective_loss.ObjectiveLoss`` on the same rows; a stored
reference's log-probability of each document comes in the batch as ``reference_logps``
(``PackedRows(reference=...)``).

A mixture-of-experts model adds its load-balancing term over the rows' tokens without
padding (:class:`MoECrossEntropyLoss`; ``ObjectiveLoss(balance=...)``).

Example::

    data = PackedDataset("data/chat")
    train = GlobalBatches(PackedRows(data, pad_id=0), batch_size=8, seed=0)
    backend = FabricBackend(model, optimizer, train, loss_fn=cross_entropy_loss,
                            mean_over=ObjectiveItems(run))

    pairs = PackedDataset("data/pairs")
    reference = reference_logps(reference_model, pairs, pad_id=0, batch_rows=8)
    rows = PackedRows(pairs, pad_id=0, reference=reference)   # batches carry reference_logps

    balance = RouterBalance(model_config, aux_loss_coef=0.01)  # a Qwen3-MoE
    loss_fn = MoECrossEntropyLoss(balance)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from array_api_compat import array_namespace
from torch.utils.data import Dataset

from baton.backends.fabric.cross_entropy import (
    FULL,
    CrossEntropy,
    supervised_loss,
    target_logps,
)
from baton.backends.fabric.moe import RouterBalance
from baton.backends.fabric.objective_loss import model_inputs
from baton.backends.torch_logps import IGNORE, token_logps
from baton.core.objectives.array_math import document_sums
from baton.data.packed import PackedDataset

#: the batch key of a stored reference's per-document log-probabilities (the document
#: value an objective with ``ReferenceUse.STORED`` reads)
REFERENCE_LOGPS = "reference_logps"


class PackedRows(Dataset):
    """Rows of a packed dataset as ``transformers`` inputs: a dict of ``[seq_len]``
    tensors per row (``default_collate`` stacks them); with ``reference`` (each global
    document's stored reference log-probability) also ``reference_logps``, ``[D]``."""

    def __init__(
        self, data: PackedDataset, pad_id: int, reference: np.ndarray | None = None
    ) -> None:
        self.data, self.pad_id, self.reference = data, pad_id, reference

    def __len__(self) -> int:
        return self.data.num_rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        batch = self.data.batch([index], pad_id=self.pad_id)
        targets = torch.from_numpy(batch.targets[0])
        loss_mask = torch.from_numpy(batch.loss_mask[0])
        labels = targets.masked_fill(~loss_mask, IGNORE)
        item = {
            "input_ids": torch.from_numpy(batch.inputs[0]),
            "position_ids": torch.from_numpy(batch.positions[0]).long(),
            "labels": labels,
            "segments": torch.from_numpy(batch.segments[0]).long(),
            "documents": torch.from_numpy(batch.documents[0]),
        }
        if self.reference is not None:
            documents = batch.documents[0]
            known = np.where(documents >= 0, self.reference[np.maximum(documents, 0)], 0.0)
            item[REFERENCE_LOGPS] = torch.from_numpy(known)
        return item


def cross_entropy_loss(
    model: Any, batch: Mapping[str, Any], cross_entropy: CrossEntropy = FULL
) -> torch.Tensor:
    """The model's own loss on the packed batch: the sum of cross entropy over the
    supervised targets divided by ``num_items_in_batch`` (without it: their mean); on the
    ``chunked``/``fused`` paths (``cross_entropy.py``) the same sum without the full
    float32 logits."""
    labels = batch["labels"]
    count = batch.get("num_items_in_batch")
    if cross_entropy.path != "full":
        num_items = count if count is not None else (labels != IGNORE).sum()
        return supervised_loss(model, model_inputs(batch), labels, num_items, cross_entropy)[1]
    output = model(
        **model_inputs(batch),
        labels=labels,  # already the next tokens: ``shift_labels`` tells transformers so
        shift_labels=labels,
        num_items_in_batch=count if count is not None else (labels != IGNORE).sum(),
    )
    return output.loss


def _share(items: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor | float:
    """This micro-batch's part of the global batch's items (1 outside a training step)."""
    total = batch.get("num_items_in_batch")
    return 1.0 if total is None else items / total


class MoECrossEntropyLoss:
    """:func:`cross_entropy_loss` for a mixture-of-experts model, plus its load-balancing
    term over the rows' tokens (:class:`~baton.backends.fabric.moe.RouterBalance`);
    returns ``(loss, {"moe/aux_loss", "moe/load_balance"})``. The cross entropy is the
    model's own loss function, as :func:`cross_entropy_loss` has it, or the same sum on
    the ``chunked``/``fused`` paths.

    Example::

        loss_fn = MoECrossEntropyLoss(RouterBalance(config, aux_loss_coef=0.01))
    """

    def __init__(self, balance: RouterBalance, cross_entropy: CrossEntropy = FULL) -> None:
        self.balance, self.cross_entropy = balance, cross_entropy

    def __call__(
        self, model: Any, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = batch["labels"]
        supervised = (labels != IGNORE).sum()
        count = batch.get("num_items_in_batch")
        num_items = count if count is not None else supervised
        inputs = model_inputs(batch) | {"output_router_logits": True}
        if self.cross_entropy.path == "full":
            output = model(**inputs)
            cross_entropy = model.loss_function(
                logits=output.logits,
                labels=None,
                shift_labels=labels,  # already the next tokens
                vocab_size=output.logits.shape[-1],
                num_items_in_batch=num_items,
            )
        else:
            output, cross_entropy = supervised_loss(
                model, inputs, labels, num_items, self.cross_entropy
            )
        term, metrics = self.balance(
            output.router_logits, batch["segments"] > 0, _share(supervised, batch)
        )
        return cross_entropy + term, metrics


@torch.no_grad()
def reference_logps(
    model: Any,
    data: PackedDataset,
    *,
    pad_id: int,
    batch_rows: int,
    device: Any = "cpu",
    cross_entropy: CrossEntropy = FULL,
) -> np.ndarray:
    """``[num_sequences]`` float64: each document's sum of ``model``'s log-probabilities
    over its supervised targets, computed on packed rows as training sees them (on the
    ``chunked``/``fused`` paths without the full logits) and summed as an objective's
    loss sums the policy's (``array_math.document_sums``)."""
    model.eval()
    rows = PackedRows(data, pad_id)
    out = np.zeros(data.num_sequences, dtype=np.float64)
    for start in range(0, len(rows), batch_rows):
        items = [rows[i] for i in range(start, min(start + batch_rows, len(rows)))]
        batch = {k: torch.stack([item[k] for item in items]).to(device) for k in items[0]}
        labels, documents = batch["labels"], batch["documents"]
        if cross_entropy.path == "full":
            logits = model(**model_inputs(batch)).logits
            logps = token_logps(logits, labels.clamp(min=0)) * (labels != IGNORE).float()
        else:  # IGNORE targets get 0
            logps = target_logps(model, model_inputs(batch), labels, cross_entropy)[1]
        xp = array_namespace(logps)
        sums = document_sums(xp, logps, batch["segments"], documents.shape[1])
        present = documents >= 0
        out[documents[present].cpu().numpy()] = sums[present].double().cpu().numpy()
    return out
