"""A step's rollouts as training rows: one prompt + completion per row, with the values
the GRPO loss reads and one JSON-ready record per rollout.

Rows follow :class:`baton.data.packed.PackedBatch`'s conventions: row ``b`` holds the
rollout's tokens ``prompt + completion`` (``L`` tokens, ``L <= seq_len + 1``), right
padded with ``pad_id``; ``inputs[b, t] = tokens[t]`` and ``targets[b, t] = tokens[t + 1]``
for ``t < L - 1``; ``loss_mask`` is True on the completion's targets (``t >= P - 1`` for a
prompt of ``P`` tokens), and on none of a truncated completion's under
``--mask-truncated-completions``; ``positions`` count 0, 1, ... along the row;
``segments`` are 1 on real tokens and 0 on padding; ``documents`` (``[N, 1]``) hold each
rollout's index in the step. ``values`` hold what the loss reads beside the rows:

- ``"old_logps"`` ``[N, seq_len]`` float32: the sampling log-probability of
  ``targets[b, t]`` on the completion's targets, 0 elsewhere;
- ``"advantages"`` ``[N, 1]`` float32: each rollout's advantage;
- ``"ref_logps"`` ``[N, seq_len]`` float32 (with a KL term only): the reference model's
  log-probability of the same targets.

Example::

    from baton.data.rollouts import Rollout, RolloutBatch

    records = [Rollout(step=1, index=i, prompt_index=7, prompt_ids=[5, 6, 7],
                       completion_ids=c.ids, completion=text(c.ids), rewards={"accuracy": 1.0},
                       reward=1.0, advantage=0.7, logp_sum=sum(c.logps), truncated=c.truncated)
               for i, c in enumerate(completions)]
    batch = RolloutBatch.build(records, [c.logps for c in completions], seq_len=96, pad_id=0,
                               mask_truncated_completions=False)
    batch.rows.inputs, batch.rows.loss_mask, batch.values["old_logps"]
    mine = batch.rows_of(rank=1, ranks=2)        # this rank's contiguous share
    for micro in mine.micro_batches(4): ...      # the engine's micro-batches
    arrays, records = batch.to_state()           # exact round trip: RolloutBatch.from_state
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from baton.data.packed import PackedBatch

#: the ``PackedBatch`` fields, in order
ROW_FIELDS = ("inputs", "targets", "loss_mask", "positions", "segments", "documents")
#: the values the loss reads beside the rows
VALUE_NAMES = ("old_logps", "advantages", "ref_logps")


def _json_float(value: float | None) -> float | None:
    """A float as JSON holds it: NaN (an unscorable reward) as ``None``."""
    return None if value is None or math.isnan(value) else float(value)


@dataclass(frozen=True)
class Rollout:
    """One rollout's record: what was sampled, how it was scored and what the loss used.

    ``rewards`` holds each reward function's value (``None``: it could not score this
    completion); ``reward`` their weighted sum (NaN when none could); ``advantage`` the
    value the loss weighs the completion with; ``logp_sum`` the sum of its sampling
    log-probabilities and ``logps`` each completion token's (the ``old_logps`` the loss
    reads); ``truncated``: no stop token within the length limit.
    """

    step: int
    index: int
    prompt_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    completion: str
    rewards: dict[str, float | None]
    reward: float
    advantage: float
    logp_sum: float
    truncated: bool
    #: each completion token's sampling log-probability (what the loss reads as old_logps)
    logps: list[float] = field(default_factory=list[float])

    def to_json(self) -> dict[str, Any]:
        """The record as JSON data (NaN as ``None``)."""
        return {
            "step": self.step,
            "index": self.index,
            "prompt_index": self.prompt_index,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "completion": self.completion,
            "rewards": {name: _json_float(value) for name, value in self.rewards.items()},
            "reward": _json_float(self.reward),
            "advantage": self.advantage,
            "logp_sum": self.logp_sum,
            "truncated": self.truncated,
            "logps": [float(v) for v in self.logps],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rollout:
        """The record ``to_json`` wrote."""
        reward = data["reward"]
        return cls(
            step=int(data["step"]),
            index=int(data["index"]),
            prompt_index=int(data["prompt_index"]),
            prompt_ids=[int(i) for i in data["prompt_ids"]],
            completion_ids=[int(i) for i in data["completion_ids"]],
            completion=str(data["completion"]),
            rewards={str(k): None if v is None else float(v) for k, v in data["rewards"].items()},
            reward=math.nan if reward is None else float(reward),
            advantage=float(data["advantage"]),
            logp_sum=float(data["logp_sum"]),
            truncated=bool(data["truncated"]),
            logps=[float(v) for v in data.get("logps", ())],
        )


@dataclass(frozen=True)
class RolloutBatch:
    """A step's rollouts as rows (see the module's text); ``records[i]`` is row ``i``'s.

    ``completion_mask`` marks the completion's targets of each row whether or not the
    loss reads them (a truncated completion's under ``--mask-truncated-completions``).
    """

    rows: PackedBatch
    values: Mapping[str, np.ndarray]
    records: tuple[Rollout, ...]
    completion_mask: np.ndarray = field(repr=False)

    @classmethod
    def build(
        cls,
        records: Sequence[Rollout],
        token_logps: Sequence[Sequence[float]],
        *,
        seq_len: int,
        pad_id: int,
        mask_truncated_completions: bool = False,
    ) -> RolloutBatch:
        """Rows of ``records`` (their prompt and completion ids) with the completions'
        sampling log-probabilities ``token_logps`` (one per completion token) and the
        records' advantages. Raises ``ValueError`` for a rollout longer than
        ``seq_len + 1`` tokens or log-probabilities that do not match a completion."""
        size = len(records)
        if len(token_logps) != size:
            raise ValueError(f"{size} rollouts but {len(token_logps)} lists of log-probabilities")
        inputs = np.full((size, seq_len), pad_id, dtype=np.int64)
        targets = np.full((size, seq_len), pad_id, dtype=np.int64)
        completion = np.zeros((size, seq_len), dtype=bool)
        positions = np.zeros((size, seq_len), dtype=np.int32)
        segments = np.zeros((size, seq_len), dtype=np.int32)
        documents = np.arange(size, dtype=np.int64).reshape(size, 1)
        old_logps = np.zeros((size, seq_len), dtype=np.float32)
        truncated = np.zeros(size, dtype=bool)
        for b, (record, logps) in enumerate(zip(records, token_logps, strict=True)):
            prompt, generated = record.prompt_ids, record.completion_ids
            if len(logps) != len(generated):
                raise ValueError(
                    f"rollout {record.index}: {len(generated)} completion tokens but "
                    f"{len(logps)} log-probabilities"
                )
            tokens = np.asarray([*prompt, *generated], dtype=np.int64)
            if len(tokens) > seq_len + 1:
                raise ValueError(
                    f"rollout {record.index} holds {len(tokens)} tokens, more than seq_len + 1 "
                    f"= {seq_len + 1}; raise seq_len to max_prompt_length + "
                    "max_completion_length"
                )
            n = len(tokens) - 1
            first = len(prompt) - 1  # the target of input first is the completion's first token
            inputs[b, :n] = tokens[:-1]
            targets[b, :n] = tokens[1:]
            positions[b, :n] = np.arange(n, dtype=np.int32)
            segments[b, :n] = 1
            completion[b, first:n] = True
            old_logps[b, first:n] = np.asarray(logps, dtype=np.float32)
            truncated[b] = record.truncated
        loss_mask = completion.copy()
        if mask_truncated_completions:
            loss_mask[truncated] = False
        rows = PackedBatch(inputs, targets, loss_mask, positions, segments, documents)
        advantages = np.asarray([r.advantage for r in records], dtype=np.float32).reshape(size, 1)
        values = {"old_logps": old_logps, "advantages": advantages}
        return cls(rows, values, tuple(records), completion)

    @property
    def size(self) -> int:
        """Rollouts (rows) in the batch."""
        return len(self.records)

    def __len__(self) -> int:
        return self.size

    def with_values(self, **arrays: np.ndarray) -> RolloutBatch:
        """The batch with more values (``ref_logps=...``), each ``[N, ...]``."""
        for name, array in arrays.items():
            if array.shape[0] != self.size:
                raise ValueError(f"value {name!r} has {array.shape[0]} rows, the batch {self.size}")
        return replace(self, values={**self.values, **arrays})

    def select(self, start: int, stop: int) -> RolloutBatch:
        """Rows ``start:stop`` (their records and values)."""
        rows = PackedBatch(*(getattr(self.rows, name)[start:stop] for name in ROW_FIELDS))
        values = {name: array[start:stop] for name, array in self.values.items()}
        return RolloutBatch(
            rows, values, self.records[start:stop], self.completion_mask[start:stop]
        )

    def rows_of(self, rank: int, ranks: int) -> RolloutBatch:
        """Data-parallel rank ``rank``'s share of ``ranks``: a contiguous block of
        ``size / ranks`` rows (rank 0 the first). Raises ``ValueError`` when ``ranks``
        does not divide the rows."""
        if ranks < 1 or not 0 <= rank < ranks:
            raise ValueError(f"rank {rank} of {ranks}: need 0 <= rank < ranks")
        if self.size % ranks:
            raise ValueError(
                f"{self.size} rollouts cannot be shared by {ranks} data-parallel ranks; "
                "make the rollouts per step a multiple of the ranks"
            )
        share = self.size // ranks
        return self.select(rank * share, (rank + 1) * share)

    def micro_batches(self, size: int) -> Iterator[RolloutBatch]:
        """Consecutive batches of ``size`` rows. Raises ``ValueError`` when ``size`` does
        not divide the rows."""
        if size < 1 or self.size % size:
            raise ValueError(f"micro-batches of {size} rows cannot cut {self.size} rollouts evenly")
        for start in range(0, self.size, size):
            yield self.select(start, start + size)

    @property
    def supervised_tokens(self) -> int:
        """Completion tokens the loss reads."""
        return self.rows.supervised_tokens

    # -- state: exact round trip ----------------------------------------------------
    def to_state(self) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """``(arrays, records)``: the batch as named arrays and JSON records;
        :meth:`from_state` gives it back bit for bit."""
        arrays = {f"rows.{name}": getattr(self.rows, name) for name in ROW_FIELDS}
        arrays.update({f"values.{name}": array for name, array in self.values.items()})
        arrays["completion_mask"] = self.completion_mask
        return arrays, [record.to_json() for record in self.records]

    @classmethod
    def from_state(
        cls, arrays: Mapping[str, np.ndarray], records: Sequence[Mapping[str, Any]]
    ) -> RolloutBatch:
        """The batch ``to_state`` described."""
        rows = PackedBatch(*(np.asarray(arrays[f"rows.{name}"]) for name in ROW_FIELDS))
        values = {
            name.removeprefix("values."): np.asarray(array)
            for name, array in arrays.items()
            if name.startswith("values.")
        }
        return cls(
            rows,
            values,
            tuple(Rollout.from_json(record) for record in records),
            np.asarray(arrays["completion_mask"]),
        )
