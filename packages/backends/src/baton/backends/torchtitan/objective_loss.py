"""An objective's loss (``baton.core.objectives``) as TorchTitan's loss function: how every
objective without TorchTitan's own cross entropy (DPO, a package's own) trains inside
``Trainer.train_step``, from its declaration alone.

``ObjectiveLoss`` is a TorchTitan ``BaseLoss``, built by TorchTitan from
``ObjectiveLoss.Config(run=...)`` (``objective.use_objective`` sets it). ``train_step``
calls it on each micro-batch's logits and labels (labels at TorchTitan's ignore index
wherever the target is not supervised) and backpropagates what it returns. Per
micro-batch it:

- takes the micro-batch's ``Rows`` from ``row_feed.RowFeed``: the document of each
  target, each document's global index and the objective's values (``[B, D]`` per
  document, ``[B, T]`` per token), which travel beside the batch;
- computes the log-probability of each label under ``logits / run.temperature`` with
  TorchTitan's ``compute_logprobs`` (float32; it gathers tensor-parallel vocabulary shards
  first), with the entropy (no gradient) when the objective reads it;
- returns ``run.loss(...).total / items``: ``items`` is ``run.items`` of every micro-batch
  of the step on every data-parallel rank (counted as the feed takes them, summed over
  the ranks by one all-reduce per step), so the step's loss, summed over micro-batches and
  ranks as TorchTitan sums them, is the objective's mean over the global batch;
- adds its metrics' ``(sum, weight)`` pairs into one ``[2, M]`` tensor on the device
  (``RowFeed.metric_sums``), reduced over the ranks on log steps only and reported as
  ``sum / weight`` (the backend's ``fetch``).

The loss is the whole-sequence one (no chunked ``lm_head``: an objective may combine a
document's tokens non-linearly), and ``objective.use_objective`` turns TorchTitan's CUDA
graphs off for it, since the rows come from Python beside the batch.

Example::

    config.loss = ObjectiveLoss.Config(run=ObjectiveRun.of("dpo", dpo_beta=0.1))
    trainer = config.build()
    trainer.loss_fn.feed = row_feed(trainer, config, trainer.loss_fn.run, init_from=None)
    trainer.train_step(batches)          # batches: feed.take(input_dict, labels) on each
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torchtitan.components.loss import BaseLoss
from torchtitan.config import CompileConfig

from baton.backends.torchtitan.token_logps import TORCH, token_logps
from baton.core.objectives import LossInputs, ObjectiveRun

if TYPE_CHECKING:
    from baton.backends.torchtitan.row_feed import RowFeed


class ObjectiveLoss(BaseLoss):
    """An objective's loss (``Config.run``) on the rows ``feed`` hands it."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        run: ObjectiveRun | None = None
        """The objective and its settings' values."""

        def to_dict(self) -> dict[str, Any]:
            """What TorchTitan's config dump shows: the objective and its settings."""
            return {"objective": None if self.run is None else self.run.settings()}

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        if config.run is None:
            raise ValueError("ObjectiveLoss.Config needs run= (an ObjectiveRun)")
        self.run: ObjectiveRun = config.run
        #: set by the backend at setup (the rows beside the batches)
        self.feed: RowFeed | None = None

    def __call__(
        self,
        pred: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feed, run = self.feed, self.run
        if feed is None:
            raise RuntimeError("ObjectiveLoss has no RowFeed: the backend sets loss_fn.feed")
        rows = feed.next_rows(labels.device)
        logps, entropy = token_logps(pred, labels, run.temperature, entropy=run.objective.entropy)
        terms = run.loss(TORCH, LossInputs(rows, logps, entropy))
        feed.add_metrics(terms, like=logps)
        return terms.total / feed.global_items(labels.device), {}
