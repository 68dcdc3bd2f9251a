"""The rows of each micro-batch beside TorchTitan's batches, for an objective's own loss
(``objective_loss.ObjectiveLoss``): what the data says about them before the model runs.

A row carries, besides TorchTitan's ``input`` and ``positions``, the document of each
input token (``segments``) and each document's global index (``documents``), and may
carry the objective's values (``values.<name>``: ``[D]`` per document or ``[T]`` per
token, from a stream of rows that computes them). ``RowFeed.take`` takes them off each
``(input_dict, labels)`` the backend's batch iterator hands out, before TorchTitan moves
the batch to the model; ``Trainer.train_step`` reads every micro-batch of a step before
its first forward, so the feed holds them in the order the loss later asks for them, and
has counted the step's items (``run.items``) by then. Values kept beside the data per
global document (``stored``: a stored reference's log-probabilities) are looked up by
each row's documents.

Example::

    feed = row_feed(trainer, config, run, init_from="hf-model/")   # at setup
    feed.start_step()
    feed.take(input_dict, labels)          # each micro-batch, off the batch iterator
    rows = feed.next_rows(device)          # in the loss, in the same order
    feed.global_items(device)              # the step's items over every rank
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torchtitan.components.loss import IGNORE_INDEX

from baton.backends.torch_logps import metric_sums
from baton.backends.torchtitan.packed import DOCUMENT_KEYS, VALUE_PREFIX
from baton.backends.torchtitan.token_logps import TORCH
from baton.core.errors import UsageError
from baton.core.objectives import LossTerms, ObjectiveRun, Rows


class RowFeed:
    """The rows of a step's micro-batches, from the batch iterator to the loss, and the
    step's item count and metric sums.

    ``stored``: per-document values kept beside the data, each ``[num_sequences]``
    indexed by a document's global index (absent documents get 0). ``count``: this rank's
    item count to the global batch's (an all-reduce over the data-parallel ranks, or the
    identity on one). The rows hand the loss each value the objective declares that is
    stored or carried (``VALUE_PREFIX`` keys); one its settings leave out (GRPO's
    ``ref_logps`` without a KL term) is simply absent."""

    def __init__(
        self,
        run: ObjectiveRun,
        count: Callable[[torch.Tensor], torch.Tensor],
        stored: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.run = run
        self.count = count
        self.stored = dict(stored or {})
        self._rows: deque[Rows] = deque()
        self._local_items = torch.zeros((), dtype=torch.float64)
        self._global_items: torch.Tensor | None = None
        self._sums: torch.Tensor | None = None
        #: the names of the metrics the loss returns (known after its first call)
        self.metric_names: tuple[str, ...] | None = None

    def start_step(self) -> None:
        """Forget the previous step's rows, count and metrics."""
        self._rows.clear()
        self._local_items = torch.zeros((), dtype=torch.float64)
        self._global_items = None
        self._sums = None

    def take(self, input_dict: dict[str, Any], labels: torch.Tensor) -> None:
        """Take a micro-batch's rows off ``input_dict`` (before it reaches the model)."""
        segments, documents = (input_dict.pop(key) for key in DOCUMENT_KEYS)
        values: dict[str, torch.Tensor] = {}
        objective = self.run.objective
        for name in (*objective.document_values, *objective.token_values):
            if name in self.stored:
                values[name] = per_document(self.stored[name], documents)
            elif VALUE_PREFIX + name in input_dict:
                values[name] = input_dict.pop(VALUE_PREFIX + name)
        rows = Rows(labels != IGNORE_INDEX, segments, documents, values)
        self._rows.append(rows)
        self._local_items = self._local_items + self.run.items(TORCH, rows)

    def next_rows(self, device: torch.device) -> Rows:
        """The rows of the micro-batch the loss is called on, on ``device``."""
        if not self._rows:
            raise RuntimeError("ObjectiveLoss called on a micro-batch RowFeed did not see")
        rows = self._rows.popleft()
        return replace(
            rows,
            mask=rows.mask.to(device),
            segments=rows.segments.to(device),
            documents=rows.documents.to(device),
            values={name: value.to(device) for name, value in rows.values.items()},
        )

    def global_items(self, device: torch.device) -> torch.Tensor:
        """The step's items over every micro-batch and rank (one all-reduce per step)."""
        if self._global_items is None:
            local = self._local_items.to(device=device, dtype=torch.float32)
            self._global_items = self.count(local).clamp(min=1)
        return self._global_items

    def add_metrics(self, terms: LossTerms, like: torch.Tensor) -> None:
        """Add a micro-batch's metrics (detached) to the step's sums."""
        if self.metric_names is None:  # the metrics the run's loss returns
            self.metric_names = tuple(terms.metrics)
        sums = metric_sums(terms, self.metric_names, like=like)
        self._sums = sums if self._sums is None else self._sums + sums

    def metric_sums(self) -> torch.Tensor | None:
        """``[2, M]``: this rank's ``(sum, weight)`` of each of ``metric_names`` over the
        step (None before a loss call)."""
        return self._sums


def per_document(table: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """``[B, D]``: ``table``'s value of each document (0 where a row holds fewer)."""
    picked = table[documents.clamp(min=0)]
    return torch.where(documents >= 0, picked, torch.zeros_like(picked))


def row_feed(trainer: Any, config: Any, run: ObjectiveRun, *, init_from: str | None) -> RowFeed:
    """The ``RowFeed`` of a run of ``run`` on ``trainer`` (after ``setup`` loaded the
    starting weights, whose source as given is ``init_from``): the values stored beside
    the data (a stored reference's log-probabilities, read or computed now on every
    rank) and the step's item count summed over the data-parallel ranks."""
    from torchtitan.distributed import utils as dist_utils

    from baton.backends.torchtitan.reference import stored_document_values

    dims = trainer.parallel_dims
    if dims.pp_enabled or dims.cp_enabled:
        raise UsageError(
            f"--objective {run.name} on TorchTitan runs with data and tensor parallelism; "
            "use --pp 1 (and no context parallelism)"
        )
    mesh = dims.get_mesh("batch") if dims.dp_enabled else None

    def all_reduce(value: torch.Tensor) -> torch.Tensor:
        return value if mesh is None else dist_utils.dist_sum_tensor(value, mesh)

    stored = stored_document_values(
        trainer, config, run, init_from=init_from, all_reduce=all_reduce,
        rank=0 if mesh is None else mesh.get_local_rank(),
        ranks=1 if mesh is None else mesh.size(),
    )  # fmt: skip
    return RowFeed(run, count=all_reduce, stored=stored)
