"""Rollouts on Fabric's path: each step's ``RolloutBatch`` (the rollout phase's
``current``, ``baton.backends.rollouts``) as the batches ``FabricBackend``'s step draws.

A run that trains on rollouts (an objective declaring ``rollouts``: GRPO) reads no
prepared rows: the rollout phase makes the step's batch before ``train_step`` (every
rank holds it), and ``RolloutRows`` is the backend's ``data``. On each rank it is a
``RolloutStream``: at the first draw of a step it takes this data-parallel rank's
contiguous share of the step's rows (``rows_of(rank, ranks)``: ``batch_size x
grad_accum`` rollouts) and hands it out in ``grad_accum`` micro-batches of
``batch_size`` rows, as ``objective_loss.ObjectiveLoss`` reads packed rows: ``input_ids``,
``position_ids`` (0, 1, ... along each rollout), ``labels`` (the completion's next
tokens, -100 elsewhere), ``segments`` (1 on the rollout's tokens), ``documents``
(``[B, 1]``: the rollout's index in the step) and the rollouts' values by their own
names: ``old_logps`` and ``ref_logps`` per token, ``advantages`` per rollout.

Rollouts per step are ``batch_size x ranks x grad_accum``: the rollout phase's
``rows_per_step``. A group of completions may sit on several ranks and micro-batches:
the advantages are computed before the batch is shared, and the loss is a mean over the
global batch (``FabricBackend(mean_over=ObjectiveItems(run))``).

A stream keeps no position of its own: the rollout phase saves the prompt order, the
sampler's state and the batch not yet used up with every checkpoint, so a GRPO
checkpoint resumes on any number of ranks. Nor has it data to skip: a run rolled back
(``LossGuard``) samples the rolled-back steps' rollouts again from the phase's restored
state, the same rollouts as before.

Example::

    rows = RolloutRows(batch_size=8)                     # FabricBackend(data=rows, ...)
    phase = build_rollout_phase(..., gather_weights=backend.gather_weights,
                                broadcast=backend.broadcast)
    rows.read_from(lambda: phase.current)
    stream = rows.shard(rank=0, world_size=2, grad_accum=1)   # what setup makes
    micro = stream.next()      # input_ids, labels, ..., old_logps, advantages
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from baton.backends.torch_logps import IGNORE
from baton.data.rollouts import RolloutBatch

#: what a source of rollouts answers: the step's batch (``None`` before the first step)
CurrentRollouts = Callable[[], RolloutBatch | None]


def micro_batch(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """Rows of rollouts as the packed rows ``ObjectiveLoss`` reads (host tensors)."""
    rows = batch.rows
    targets = torch.as_tensor(rows.targets, dtype=torch.int64)
    supervised = torch.as_tensor(rows.loss_mask, dtype=torch.bool)
    out = {
        "input_ids": torch.as_tensor(rows.inputs, dtype=torch.int64),
        "position_ids": torch.as_tensor(rows.positions, dtype=torch.int64),
        "labels": targets.masked_fill(~supervised, IGNORE),
        "segments": torch.as_tensor(rows.segments, dtype=torch.int64),
        "documents": torch.as_tensor(rows.documents, dtype=torch.int64),
    }
    for name, value in batch.values.items():
        out[name] = torch.as_tensor(value, dtype=torch.float32)
    return out


class RolloutStream:
    """This rank's micro-batches of each step's rollouts (see the module's text); the
    backend's step draws ``grad_accum`` of them a step."""

    def __init__(
        self,
        current: CurrentRollouts,
        *,
        batch_size: int,
        grad_accum: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.current = current
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size
        self._micro_batches: Iterator[RolloutBatch] = iter(())
        self._left = 0

    @property
    def rows_per_step(self) -> int:
        """Rollouts per step over every rank."""
        return self.batch_size * self.world_size * self.grad_accum

    def next(self) -> dict[str, torch.Tensor]:
        """The step's next micro-batch of this rank (its first draw takes the share)."""
        if self._left == 0:
            self._take_share()
        self._left -= 1
        return micro_batch(next(self._micro_batches))

    def _take_share(self) -> None:
        batch = self.current()
        if batch is None:
            raise RuntimeError(
                "no rollouts for this step: the rollout phase runs before each training step "
                "(Driver(..., rollouts=phase))"
            )
        if batch.size != self.rows_per_step:
            raise RuntimeError(
                f"the step's {batch.size} rollouts are not the {self.rows_per_step} rows of a "
                "step (batch size x ranks x gradient accumulation): build the rollout phase "
                "with rows_per_step equal to them"
            )
        share = batch.rows_of(self.rank, self.world_size)
        self._micro_batches = share.micro_batches(self.batch_size)
        self._left = self.grad_accum

    def skip(self, steps: int) -> None:
        """Nothing to skip: a step's rollouts are sampled from the phase's state (see the
        module's text)."""
        del steps

    def state_dict(self) -> dict[str, Any]:
        """No position: the rollout phase's state is the run's data position."""
        return {"rollouts": True, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A rollouts position (any number of ranks); the next draw takes the share of
        the phase's restored batch."""
        if not state.get("rollouts"):
            raise ValueError(
                "the checkpoint's data position is of prepared data, not of rollouts: "
                "resume with the objective the run was saved with"
            )
        self._micro_batches, self._left = iter(()), 0


class RolloutRows:
    """The training data of a run on rollouts: ``FabricBackend(data=RolloutRows(...))``
    (see the module's text); ``read_from`` names the rollout phase's current batch
    before the run starts."""

    def __init__(self, batch_size: int, current: CurrentRollouts | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"RolloutRows needs batch_size >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.current = current

    def read_from(self, current: CurrentRollouts) -> None:
        """Read each step's rollouts from ``current()`` (``lambda: phase.current``)."""
        self.current = current

    def shard(self, rank: int, world_size: int, grad_accum: int) -> RolloutStream:
        """Rank ``rank``'s stream of ``world_size`` ranks."""
        if self.current is None:
            raise ValueError(
                "RolloutRows reads the rollout phase's batches: call read_from(lambda: "
                "phase.current) before the run starts"
            )
        return RolloutStream(
            self.current,
            batch_size=self.batch_size,
            grad_accum=grad_accum,
            rank=rank,
            world_size=world_size,
        )
