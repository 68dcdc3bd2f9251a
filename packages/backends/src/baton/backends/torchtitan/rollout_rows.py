"""A step's rollouts (online RL) on TorchTitan's data-loader protocol: what
``Trainer.train_step`` reads on a run whose objective samples rollouts each step.

``RolloutDataLoader`` is a TorchTitan ``BaseDataLoader`` (built from its ``Config`` by
``Trainer.__init__``, like any data loader). It reads no prepared dataset: the rollout
phase (``baton.backends.rollouts.phase``) makes each step's ``RolloutBatch`` before the
step, and ``current`` (set by the backend at setup) returns it. Each step, the loader
takes this data-parallel rank's contiguous share (``rows_of(dp_rank, dp_world_size)``)
and yields it in micro-batches of ``local_batch_size`` rows, as the
``({"input", "positions", "segments", "documents", "values.<name>"}, labels)`` pairs
the generic objective loss reads (``row_feed.RowFeed`` takes everything but ``input``
and ``positions`` off before the model sees them):

- ``labels`` are the rows' targets at TorchTitan's ignore index (-100) outside the loss
  mask (the prompt, padding, a truncated completion under
  ``--mask-truncated-completions``);
- ``positions`` count 0, 1, ... along each rollout (one document a row);
- ``values.old_logps`` and ``values.ref_logps`` (``[B, T]``) and ``values.advantages``
  (``[B, 1]``) are the rollouts' values.

A step reads exactly its share (rows per step = local batch x data-parallel ranks x
gradient accumulation, which the rollout phase is built with), so the next step's first
read finds the next batch (or, with ``--num-iterations`` above 1, the same batch again).
The loader keeps no position of its own: the rollout phase's state is in every
checkpoint, and a run resumed on any data-parallel degree reads its batches from there.

Example::

    config.dataloader = RolloutDataLoader.Config()
    trainer = config.build()
    trainer.dataloader.current = lambda: phase.current     # the backend does this
    input_dict, labels = next(iter(trainer.dataloader))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX

from baton.backends.torchtitan.packed import VALUE_PREFIX
from baton.data.rollouts import RolloutBatch

#: the loader's checkpointed state: a marker only (the rollout phase holds the position)
STATE = {"rollouts": 1}


def rollout_inputs(batch: RolloutBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``batch``'s rows as TorchTitan's ``(input_dict, labels)`` with the rows' documents
    and the objective's values beside them."""
    rows = batch.rows
    labels = np.where(rows.loss_mask, rows.targets, IGNORE_INDEX)
    inputs: dict[str, torch.Tensor] = {
        "input": torch.from_numpy(np.ascontiguousarray(rows.inputs, dtype=np.int64)),
        "positions": torch.from_numpy(rows.positions.astype(np.int64)),
        "segments": torch.from_numpy(rows.segments.astype(np.int64)),
        "documents": torch.from_numpy(rows.documents.astype(np.int64)),
    }
    for name, value in batch.values.items():
        inputs[VALUE_PREFIX + name] = torch.from_numpy(np.ascontiguousarray(value))
    return inputs, torch.from_numpy(labels.astype(np.int64))


class RolloutDataLoader(BaseDataLoader):
    """This data-parallel rank's share of each step's rollouts, in micro-batches."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = "rollouts"

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        local_batch_size: int,
        **kwargs: Any,
    ) -> None:
        self.config = config
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.local_batch_size = local_batch_size
        #: the step's rollouts (set by the backend before the first step)
        self.current: Callable[[], RolloutBatch | None] | None = None

    def _share(self) -> RolloutBatch:
        if self.current is None:
            raise RuntimeError("RolloutDataLoader has no rollouts: the backend sets current")
        batch = self.current()
        if batch is None:
            raise RuntimeError("no rollouts yet: the rollout phase runs before each step")
        return batch.rows_of(self.dp_rank, self.dp_world_size)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:  # one pass per step: the share of the batch the step trains on
            for micro in self._share().micro_batches(self.local_batch_size):
                yield rollout_inputs(micro)

    def state_dict(self) -> dict[str, Any]:
        return dict(STATE)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        del state_dict  # the rollout phase's own state comes back with the checkpoint
