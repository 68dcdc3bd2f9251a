"""Post-training on the Fabric backend with ``transformers`` models: SFT and DPO on packed
rows (``baton.data.packed``).

Rows go to the model natively: ``input_ids`` (a row's tokens but the last),
``position_ids`` restarting at 0 in each document, no attention mask and no KV cache
(``use_cache=False``), from which ``transformers`` builds a block-causal mask (a query
never sees another document; with a cache it would not look for packed documents), and
for SFT ``labels``/``shift_labels`` (the next tokens, -100 where not supervised: the
model's own loss). With ``FabricBackend(mean_over=...)`` the batch also carries
``num_items_in_batch``, the global batch's supervised tokens (SFT) or pairs (DPO), so a
step's loss is the mean over the global batch.

DPO sums each document's log-probabilities over its supervised targets
(``baton.backends.torch_objectives``); documents 2k-1 and 2k of a row are a pair
(chosen, rejected), and each document's reference log-probability comes precomputed
(``reference_logps``) in the batch.

A mixture-of-experts model adds its load-balancing term to either loss, over the rows'
tokens without padding (:class:`MoESFTLoss`, ``DPOLoss(balance=...)``; TRL's DPO adds
the model's term as well).

Example::

    data = PackedDataset("data/chat")
    train = GlobalBatches(PackedRows(data, pad_id=0), batch_size=8, seed=0)
    backend = FabricBackend(model, optimizer, train, loss_fn=sft_loss, mean_over=supervised_tokens)

    pairs = PackedDataset("data/pairs")
    reference = reference_logps(reference_model, pairs, pad_id=0, batch_rows=8)
    rows = PackedRows(pairs, pad_id=0, reference=reference)
    backend = FabricBackend(model, optimizer, GlobalBatches(rows, batch_size=8),
                            loss_fn=DPOLoss(beta=0.1, loss_type="sigmoid"), mean_over=pair_count)

    balance = RouterBalance(model_config, aux_loss_coef=0.01)  # a Qwen3-MoE
    backend = FabricBackend(model, optimizer, train, loss_fn=MoESFTLoss(balance),
                            mean_over=supervised_tokens)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from baton.backends import torch_objectives as objectives
from baton.backends.fabric.moe import RouterBalance
from baton.data.packed import PackedDataset


class PackedRows(Dataset):
    """Rows of a packed dataset as ``transformers`` inputs: a dict of ``[seq_len]``
    tensors per row (``default_collate`` stacks them)."""

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
        labels = targets.masked_fill(~loss_mask, -100)
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
            item["reference_logps"] = torch.from_numpy(known)
        return item


def supervised_tokens(batch: Mapping[str, torch.Tensor]) -> int:
    """The supervised targets of a batch (``FabricBackend(mean_over=...)`` for SFT)."""
    return int((batch["labels"] != -100).sum())


def pair_count(batch: Mapping[str, torch.Tensor]) -> int:
    """The preference pairs of a batch (``FabricBackend(mean_over=...)`` for DPO)."""
    return int((batch["documents"][:, 0::2] >= 0).sum())


def _model_inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """What the model is called with: without a KV cache and without an attention mask,
    ``transformers`` reads packed documents from the restarting ``position_ids``."""
    return {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "use_cache": False,
    }


def sft_loss(model: Any, batch: Mapping[str, Any]) -> torch.Tensor:
    """The model's own loss on the packed batch: the sum of cross entropy over the
    supervised targets divided by ``num_items_in_batch`` (without it: their mean)."""
    labels = batch["labels"]
    count = batch.get("num_items_in_batch")
    output = model(
        **_model_inputs(batch),
        labels=labels,  # already the next tokens: ``shift_labels`` tells transformers so
        shift_labels=labels,
        num_items_in_batch=count if count is not None else (labels != -100).sum(),
    )
    return output.loss


def _share(items: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor | float:
    """This micro-batch's part of the global batch's items (1 outside a training step)."""
    total = batch.get("num_items_in_batch")
    return 1.0 if total is None else items / total


class MoESFTLoss:
    """:func:`sft_loss` for a mixture-of-experts model, plus its load-balancing term over
    the rows' tokens (:class:`~baton.backends.fabric.moe.RouterBalance`); returns
    ``(loss, {"moe/aux_loss", "moe/load_balance"})``. The cross entropy is the model's
    own loss function, as :func:`sft_loss` has it.

    Example::

        loss_fn = MoESFTLoss(RouterBalance(config, aux_loss_coef=0.01))
    """

    def __init__(self, balance: RouterBalance) -> None:
        self.balance = balance

    def __call__(
        self, model: Any, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = batch["labels"]
        supervised = (labels != -100).sum()
        count = batch.get("num_items_in_batch")
        output = model(**_model_inputs(batch), output_router_logits=True)
        cross_entropy = model.loss_function(
            logits=output.logits,
            labels=None,
            shift_labels=labels,  # already the next tokens
            vocab_size=output.logits.shape[-1],
            num_items_in_batch=count if count is not None else supervised,
        )
        term, metrics = self.balance(
            output.router_logits, batch["segments"] > 0, _share(supervised, batch)
        )
        return cross_entropy + term, metrics


class DPOLoss:
    """``loss_fn(model, batch) -> (loss, TRL's metrics)`` of DPO on packed pairs whose
    reference log-probabilities are in the batch (``PackedRows(reference=...)``)."""

    def __init__(self, beta: float, loss_type: str, balance: RouterBalance | None = None) -> None:
        if loss_type not in objectives.DPO_LOSSES:
            raise ValueError(
                f"DPO loss {loss_type!r}: use one of {', '.join(objectives.DPO_LOSSES)}"
            )
        self.beta, self.loss_type, self.balance = beta, loss_type, balance

    def __call__(
        self, model: Any, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        documents = batch["documents"]
        if self.balance is None:
            output = model(**_model_inputs(batch))
        else:
            output = model(**_model_inputs(batch), output_router_logits=True)
        logits = output.logits
        labels = batch["labels"]
        logps, counts = objectives.document_logps(
            logits, labels.clamp(min=0), labels != -100, batch["segments"], documents.shape[1]
        )
        losses, sums = objectives.pair_losses(
            logps, counts, batch["reference_logps"], documents,
            beta=self.beta, loss_type=self.loss_type,
        )  # fmt: skip
        pairs = batch.get("num_items_in_batch")
        if pairs is None:
            pairs = torch.tensor(float(max(len(losses), 1)), device=losses.device)
        loss = losses.sum() / pairs
        metrics = {name: value / pairs for name, value in sums.items()}
        if self.balance is not None:  # TRL adds the model's load-balancing term as well
            share = _share((documents[:, 0::2] >= 0).sum(), batch)
            term, moe = self.balance(output.router_logits, batch["segments"] > 0, share)
            loss, metrics = loss + term, metrics | moe
        return loss, metrics


@torch.no_grad()
def reference_logps(
    model: Any, data: PackedDataset, *, pad_id: int, batch_rows: int, device: Any = "cpu"
) -> np.ndarray:
    """``[num_sequences]`` float64: each document's sum of ``model``'s log-probabilities
    over its supervised targets, computed on packed rows as training sees them."""
    model.eval()
    rows = PackedRows(data, pad_id)
    out = np.zeros(data.num_sequences, dtype=np.float64)
    for start in range(0, len(rows), batch_rows):
        items = [rows[i] for i in range(start, min(start + batch_rows, len(rows)))]
        batch = {k: torch.stack([item[k] for item in items]).to(device) for k in items[0]}
        logits = model(**_model_inputs(batch)).logits
        labels = batch["labels"]
        documents = batch["documents"]
        logps, _ = objectives.document_logps(
            logits, labels.clamp(min=0), labels != -100, batch["segments"], documents.shape[1]
        )
        present = documents >= 0
        out[documents[present].cpu().numpy()] = logps[present].double().cpu().numpy()
    return out
