"""Rollouts on Megatron's path: each step's ``RolloutBatch`` (the rollout phase's
``current``, ``baton.backends.rollouts``) as the data iterator Megatron's schedule reads.

The schedule takes ``num_microbatches`` and one data iterator per model chunk. For an
objective that trains on rollouts that iterator is a ``RolloutStream``: at the start of
each step it takes this data-parallel rank's contiguous share of the step's rows
(``rows_of(dp_rank, dp_size)``) and hands it out in micro-batches of
``micro_batch_size`` rows, as the packed forward step reads them (``packed_data``'s keys:
``tokens``, ``labels``, ``loss_mask``, ``position_ids``, ``segments``, ``documents``) with
the rollouts' values under ``values/<name>``: the sampling log-probabilities
``old_logps`` and the reference's ``ref_logps`` per token (``[b, s]``), the
``advantages`` per rollout (``[b, 1]``, each row one rollout). The step's rows must be
the global batch (``global_batch_size`` rows: ``micro_batch_size`` x data-parallel ranks x
micro-batches).

A stream holds no data position of its own: the rollout phase saves and restores the
step's batch and the prompt order with every checkpoint. ``consumed`` counts the rows
trained on (what a checkpoint records as the data consumed).

Example::

    stream = RolloutStream(lambda: phase.current, micro_batch_size=4, dp_rank=0, dp_size=2,
                           global_batch_size=16)
    stream.begin_step()          # the phase made (or kept) the step's batch
    micro = next(stream)         # tokens, labels, ..., values/old_logps, values/advantages
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from baton.backends.megatron.packed_data import VALUES
from baton.data.rollouts import RolloutBatch

#: what a source of rollouts answers: the step's batch (``None`` before the first step)
CurrentRollouts = Callable[[], RolloutBatch | None]


def micro_batch(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """Rows of rollouts as the packed forward step's micro-batch (host tensors)."""
    rows = batch.rows
    out = {
        "tokens": torch.as_tensor(rows.inputs, dtype=torch.int64),
        "labels": torch.as_tensor(rows.targets, dtype=torch.int64),
        "loss_mask": torch.as_tensor(rows.loss_mask, dtype=torch.float32),
        "position_ids": torch.as_tensor(rows.positions, dtype=torch.int64),
        "segments": torch.as_tensor(rows.segments, dtype=torch.int64),
        "documents": torch.as_tensor(rows.documents, dtype=torch.int64),
    }
    for name, value in batch.values.items():
        out[VALUES + name] = torch.as_tensor(value, dtype=torch.float32)
    return out


class RolloutStream:
    """This data-parallel rank's micro-batches of each step's rollouts (see the module's
    text). Megatron's schedule calls ``next`` once per micro-batch."""

    def __init__(
        self,
        current: CurrentRollouts,
        *,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        global_batch_size: int,
    ) -> None:
        self.current = current
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.global_batch_size = global_batch_size
        #: rows trained on over every data-parallel rank
        self.consumed = 0
        #: seconds spent cutting micro-batches since the last ``take_wait``
        self.waited_s = 0.0
        self._micro_batches: Iterator[RolloutBatch] = iter(())

    def begin_step(self) -> None:
        """Take this rank's share of the step's rollouts (the backend calls it before
        Megatron's schedule runs)."""
        batch = self.current()
        if batch is None:
            raise RuntimeError(
                "no rollouts for this step: the rollout phase runs before each training step "
                "(Driver(..., rollouts=phase))"
            )
        if batch.size != self.global_batch_size:
            raise RuntimeError(
                f"the step's {batch.size} rollouts are not the global batch of "
                f"{self.global_batch_size} rows: build the phase with rows_per_step equal "
                "to the global batch size"
            )
        share = batch.rows_of(self.dp_rank, self.dp_size)
        self._micro_batches = share.micro_batches(self.micro_batch_size)
        self.consumed += batch.size

    def next_micro_batch(self) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        micro = next(self._micro_batches, None)
        if micro is None:
            raise RuntimeError(
                "the schedule asked for more micro-batches than this rank's share of the "
                "step's rollouts holds"
            )
        out = micro_batch(micro)
        self.waited_s += time.perf_counter() - started
        return out

    def take_wait(self) -> float:
        """Seconds spent cutting micro-batches since the last call."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def __iter__(self) -> RolloutStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.next_micro_batch()

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "dp_size": self.dp_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = int(state["consumed"])
