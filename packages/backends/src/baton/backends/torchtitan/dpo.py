"""DPO as TorchTitan's loss function.

``DpoLoss`` is a TorchTitan ``BaseLoss``: ``Trainer.train_step`` calls it on each
micro-batch's logits and labels (labels at the ignore index outside the completions) as
it calls its cross-entropy, and backpropagates what it returns. A pair's two documents
come from one packed row, so a micro-batch and a rank always hold whole pairs. The
documents of each row (``segments``, ``documents``: ``packed.PackedRows(documents=True)``)
travel beside the batch through ``PairFeed``: the backend's batch iterator takes them off
the batch before TorchTitan moves it to the model, in the order the loss later sees the
micro-batches.

Per micro-batch the loss is ``sum over its pairs of the pair loss / pairs of the global
batch`` (every micro-batch and data-parallel rank of the step, counted once per step by
one all-reduce), so the step's loss, summed over micro-batches and ranks as TorchTitan
sums its losses, is the mean over the global batch. The math is
``baton.backends.torch_objectives`` (TRL's sigmoid and IPO losses and its metrics); the
token log-probabilities are TorchTitan's ``compute_logprobs`` (which gathers
tensor-parallel logits). TRL's metrics are summed on the device through the step and
read as means on log steps only.

Example::

    config.loss = DpoLoss.Config(beta=0.1, loss_type="sigmoid")
    trainer = config.build()
    feed = PairFeed(reference_logps, count=lambda pairs: pairs)   # one rank
    trainer.loss_fn.feed = feed
    feed.start_step()
    trainer.train_step(batches)          # batches: feed.take(input_dict) on each
    feed.metrics()                       # {"rewards/chosen": tensor, ...} this rank's share
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.loss import IGNORE_INDEX, BaseLoss, compute_logprobs
from torchtitan.config import CompileConfig

from baton.backends import torch_objectives as objectives
from baton.backends.torchtitan.packed import DOCUMENT_KEYS


class PairFeed:
    """The documents of a step's micro-batches, from the batch iterator to the loss, and
    the step's pair count and metric sums.

    ``reference`` holds each sequence's reference log-probability (``[num_sequences]``);
    ``count`` turns this rank's pair count into the global batch's (an all-reduce over the
    data-parallel ranks, or the identity on one)."""

    def __init__(
        self, reference: torch.Tensor, count: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.reference = reference
        self.count = count
        self._documents: deque[tuple[torch.Tensor, torch.Tensor]] = deque()
        self._local_pairs = 0
        self._global_pairs: torch.Tensor | None = None
        self._sums: dict[str, torch.Tensor] = {}

    def start_step(self) -> None:
        """Forget the previous step's documents, counts and metrics."""
        self._documents.clear()
        self._local_pairs = 0
        self._global_pairs = None
        self._sums = {}

    def take(self, input_dict: dict[str, torch.Tensor]) -> None:
        """Take a micro-batch's documents off ``input_dict`` (before it reaches the model)."""
        segments, documents = (input_dict.pop(key) for key in DOCUMENT_KEYS)
        self._documents.append((segments, documents))
        self._local_pairs += int((documents[:, 0::2] >= 0).sum())

    def next_documents(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(segments, documents)`` of the micro-batch the loss is called on."""
        if not self._documents:
            raise RuntimeError("DpoLoss called on a micro-batch PairFeed did not see")
        return self._documents.popleft()

    def global_pairs(self, device: torch.device) -> torch.Tensor:
        """The pairs of the whole step over every rank (one all-reduce per step)."""
        if self._global_pairs is None:
            local = torch.tensor(self._local_pairs, dtype=torch.float32, device=device)
            self._global_pairs = self.count(local).clamp(min=1)
        return self._global_pairs

    def add_metrics(self, sums: dict[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            self._sums[name] = value if name not in self._sums else self._sums[name] + value

    def metrics(self) -> dict[str, torch.Tensor]:
        """This rank's share of TRL's metric means for the step (their sum over the
        data-parallel ranks is the global batch's mean)."""
        if not self._sums:
            return {}
        pairs = self._global_pairs
        assert pairs is not None
        return {name: total / pairs for name, total in self._sums.items()}


class DpoLoss(BaseLoss):
    """TRL's DPO loss (``sigmoid`` or ``ipo``) on packed preference rows."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        beta: float = 0.1
        """How far the policy may move from the reference."""
        loss_type: str = "sigmoid"
        """``sigmoid`` (DPO) or ``ipo``."""

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        self.beta = config.beta
        self.loss_type = config.loss_type
        #: set by the backend once the reference log-probabilities are known
        self.feed: PairFeed | None = None

    def __call__(
        self,
        pred: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        feed = self.feed
        if feed is None:
            raise RuntimeError("DpoLoss has no PairFeed: the backend sets trainer.loss_fn.feed")
        segments, documents = (t.to(labels.device) for t in feed.next_documents())
        logps, counts = document_sums(pred, labels, segments, documents.shape[1])
        reference = feed.reference.to(labels.device)[documents.clamp(min=0)]
        losses, sums = objectives.pair_losses(
            logps, counts, reference, documents, beta=self.beta, loss_type=self.loss_type
        )
        feed.add_metrics(sums)
        return losses.sum() / feed.global_pairs(labels.device), {}


def document_sums(
    pred: torch.Tensor, labels: torch.Tensor, segments: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps, counts)``, each ``[B, width]``: per document of each row, the sum of the
    log-probabilities of its supervised targets (labels not at the ignore index) and
    their number."""
    mask = (labels != IGNORE_INDEX).to(torch.float32)
    tokens = compute_logprobs(pred, labels)
    assert isinstance(tokens, torch.Tensor)
    segments = segments.to(labels.device)
    return (
        objectives.segment_sums(tokens * mask, segments, width),
        objectives.segment_sums(mask, segments, width),
    )
