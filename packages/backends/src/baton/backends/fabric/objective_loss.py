"""Any objective of ``baton.core.objectives`` on packed rows of a ``transformers`` model,
from its declaration alone: Fabric's one adapter between the objective contract and its
step.

A batch is a dict of ``[B, T]`` tensors (``posttrain.PackedRows``, or any stream giving
the same keys): ``input_ids``, ``position_ids`` restarting at 0 in each document,
``labels`` (the next tokens, -100 where nothing is supervised), ``segments`` (each
input token's document 1..D, 0 on padding) and ``documents`` (``[B, D]``, each
document's global index, -1 where a row holds fewer), plus the arrays the objective
declares under their own names: its ``document_values`` (``[B, D]``, e.g. DPO's stored
``reference_logps``) and ``token_values`` (``[B, T]``, e.g. GRPO's ``old_logps``).

``ObjectiveLoss`` calls the model natively (no attention mask, ``use_cache=False``:
``transformers`` keeps attention inside each document), takes the targets'
log-probabilities at the objective's temperature and, where the objective reads it, the
entropy (``baton.backends.torch_logps`` over the full logits, or on the ``chunked`` and
``fused`` paths ``cross_entropy.target_logps`` a chunk of tokens at a time), and
returns ``run.loss``'s total divided by ``num_items_in_batch``: with
``FabricBackend(mean_over=ObjectiveItems(run))`` that is the global batch's
``run.items`` (every micro-batch and rank), so the step's loss is one mean over the
global batch. Each metric is a ``WeightedMean(sum, weight)`` the backend
adds over micro-batches and ranks (with the loss, one all-reduce) and logs as
``sum / weight``. A mixture-of-experts model adds its load-balancing term over the rows'
tokens (``moe.RouterBalance``) as a share of the global batch.

An objective with ``native_cross_entropy`` (pretraining, SFT) keeps the model's own loss
(``posttrain.sft_loss``); ``ObjectiveItems`` counts its items all the same.

Example::

    run = ObjectiveRun.of(objective)    # the recipe's --objective, with its settings
    rows = PackedRows(pairs, pad_id=0, reference=stored_logps)
    backend = FabricBackend(model, optimizer, GlobalBatches(rows, batch_size=8, seed=0),
                            loss_fn=ObjectiveLoss(run), mean_over=ObjectiveItems(run))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from array_api_compat import array_namespace

from baton.backends.fabric.cross_entropy import FULL, CrossEntropy, target_logps
from baton.backends.fabric.moe import RouterBalance
from baton.backends.fabric.step import WeightedMean
from baton.backends.torch_logps import IGNORE, loss_inputs
from baton.core.objectives import LossInputs, ObjectiveRun, Rows


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """What the model is called with: without a KV cache and without an attention mask,
    ``transformers`` reads packed documents from the restarting ``position_ids``."""
    return {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "use_cache": False,
    }


def packed_rows(run: ObjectiveRun, batch: Mapping[str, Any]) -> Rows:
    """The objective's ``Rows`` of a batch: the supervised targets, the documents and the
    values the objective declares (those the batch carries)."""
    declared = (*run.objective.document_values, *run.objective.token_values)
    return Rows(
        mask=batch["labels"] != IGNORE,
        segments=batch["segments"],
        documents=batch["documents"],
        values={name: batch[name] for name in declared if name in batch},
    )


class ObjectiveItems:
    """``mean_over(batch) -> int`` for ``FabricBackend``: the items the objective's loss
    is a mean over (``run.items``: supervised tokens, pairs, completions) in a batch."""

    def __init__(self, run: ObjectiveRun) -> None:
        self.run = run

    def __call__(self, batch: Mapping[str, Any]) -> int:
        rows = packed_rows(self.run, batch)
        return round(float(self.run.items(array_namespace(rows.mask), rows)))


class ObjectiveLoss:
    """``loss_fn(model, batch) -> (loss, metrics)`` of ``run``'s objective on packed rows
    (see the module docs); ``balance``: a mixture-of-experts model's load-balancing term.

    Outside a training step (no ``num_items_in_batch``: evaluation) the loss is the mean
    over the batch's own items and each metric the batch's own mean.
    """

    def __init__(
        self,
        run: ObjectiveRun,
        balance: RouterBalance | None = None,
        cross_entropy: CrossEntropy = FULL,
    ) -> None:
        self.run, self.balance, self.cross_entropy = run, balance, cross_entropy
        declared = run.objective.metrics
        #: the metrics' report order: the declared ones first
        self._order = {name: i for i, name in enumerate(declared)}

    def __call__(self, model: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        routed = {"output_router_logits": True} if self.balance is not None else {}
        rows = packed_rows(self.run, batch)
        if self.cross_entropy.path == "full":
            output = model(**model_inputs(batch), **routed)
            inputs = loss_inputs(self.run, rows, output.logits, batch["labels"])
        else:  # chunked (``fused`` serves SFT only: the log-probabilities are chunked)
            output, logps, entropy = target_logps(
                model, model_inputs(batch) | routed, batch["labels"], self.cross_entropy,
                temperature=self.run.temperature, entropy=self.run.objective.entropy,
            )  # fmt: skip
            inputs = LossInputs(rows, logps, entropy)
        xp = array_namespace(inputs.logps)
        terms = self.run.loss(xp, inputs)
        items = self.run.items(xp, rows)
        total = batch.get("num_items_in_batch")
        loss = terms.total / (items.clamp(min=1.0) if total is None else total)
        names = sorted(terms.metrics, key=lambda name: self._order.get(name, len(self._order)))
        metrics: dict[str, Any] = {name: WeightedMean(*terms.metrics[name]) for name in names}
        if self.balance is not None:  # TRL's trainers add the model's term as well
            share = 1.0 if total is None else items / total
            term, moe = self.balance(output.router_logits, batch["segments"] > 0, share)
            loss = loss + term
            metrics |= moe
        return loss, metrics
