"""The evaluation of a post-training run on its held-out rows, the same on every engine:
the run's objective loss over every held-out row, from its declaration alone.

An engine runs its model forward (no gradient) on the held-out rows, hands the
objective's loss what training hands it (``LossInputs``: the targets' log-probabilities
at the objective's temperature, the rows' mask, documents and values) and keeps
``evaluation_sums``: the loss's ``total``, the objective's ``items`` and each declared
metric's ``(sum, weight)``, in one flat array it adds over batches and data-parallel
ranks. ``evaluation_means`` turns the sums of every held-out row into what a run logs:
``loss`` = the sum of ``total`` over the sum of ``items`` (SFT: the mean negative
log-likelihood of every held-out supervised token; DPO: the mean loss over every
held-out pair) and each metric ``sum / weight`` (DPO: TRL's ``rewards/margins``,
``logps/chosen``...), whatever the batching. The math is the objective's own; nothing
here knows an objective by name. (An objective with ``native_cross_entropy`` may be
evaluated by the engine's own cross entropy instead: the same number.)

Rows are cut into batches of the engine's size with ``row_batches``, the last one filled
with stand-in rows (``PAD_ROW``) that ``held_out_batch`` gives nothing supervised and no
document, so they add nothing to any sum. A held-out row's document values (a stored
reference's log-probabilities) come from ``values`` kept per document of its dataset.

Array-API only (numpy on the host, torch in the torch engines, ``jax.numpy`` inside a
jitted function): every engine shares it.

Example (what an engine's evaluation does)::

    sums = None
    for rows in row_batches(held.num_rows, batch_size=8):
        batch = held_out_batch(held, rows, pad_id=0)        # a PackedBatch
        logps = engine_forward(batch)                       # [B, T], the current weights
        inputs = LossInputs(packed_rows(run, batch, values), logps)
        part = evaluation_sums(np, run, inputs)
        sums = part if sums is None else sums + part
    evaluation_means(run, all_reduce(sums))   # {"loss": 0.69, "rewards/margins": 0.01, ...}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from baton.core.objectives import LossInputs, ObjectiveRun, Rows
from baton.data.packed import PackedBatch, PackedDataset

#: a stand-in row of the last batch: nothing supervised, no document
PAD_ROW = -1


def evaluation_sums(xp: Any, run: ObjectiveRun, inputs: LossInputs) -> Any:
    """``[2 + 2M]`` float32: ``run``'s loss ``total`` and ``items`` on one batch, then the
    sum and then the weight of each of the objective's declared ``metrics`` (0 for one the
    loss does not return), detached from any gradient by the caller's no-grad context."""
    terms = run.loss(xp, inputs)
    items = run.items(xp, inputs.rows)
    names = run.objective.metrics
    zero = xp.zeros_like(xp.astype(terms.total, xp.float32))
    picked = [terms.metrics.get(name) for name in names]
    sums = [zero if pair is None else xp.astype(pair[0], xp.float32) for pair in picked]
    weights = [zero if pair is None else xp.astype(pair[1], xp.float32) for pair in picked]
    head = [xp.astype(terms.total, xp.float32), xp.astype(items, xp.float32)]
    return xp.stack([xp.reshape(v, ()) for v in (*head, *sums, *weights)])


def evaluation_means(run: ObjectiveRun, sums: Any) -> dict[str, float]:
    """``{"loss": ..., metric: ...}`` from ``evaluation_sums`` added over every held-out
    row: the loss's total over the items, each metric's sum over its weight."""
    values = np.asarray(sums, dtype=np.float64)
    names = run.objective.metrics
    count = len(names)
    means = {"loss": float(values[0] / max(values[1], 1e-12))}
    for i, name in enumerate(names):
        weight = values[2 + count + i]
        if weight > 0:
            means[name] = float(values[2 + i] / weight)
    return means


def row_batches(
    num_rows: int, batch_size: int, *, rank: int = 0, ranks: int = 1
) -> Iterator[list[int]]:
    """This data-parallel rank's share of ``num_rows`` held-out rows (round-robin), in
    batches of ``batch_size``; every rank gets as many batches (a forward over sharded
    weights is collective), the last ones filled with ``PAD_ROW``."""
    mine = list(range(rank, num_rows, ranks))
    per_rank = -(-num_rows // ranks)
    batches = -(-per_rank // batch_size)
    padded = mine + [PAD_ROW] * (batches * batch_size - len(mine))
    for start in range(0, len(padded), batch_size):
        yield padded[start : start + batch_size]


def held_out_batch(data: PackedDataset, rows: list[int], pad_id: int = 0) -> PackedBatch:
    """Rows ``rows`` of ``data`` (``PAD_ROW``: row 0 with nothing supervised and no
    document, so it adds nothing to any sum)."""
    stand_in = np.asarray([row == PAD_ROW for row in rows])
    batch = data.batch([0 if row == PAD_ROW else row for row in rows], pad_id=pad_id)
    if not stand_in.any():
        return batch
    return replace(
        batch,
        loss_mask=np.where(stand_in[:, None], False, batch.loss_mask),
        documents=np.where(stand_in[:, None], -1, batch.documents),
    )


def document_values(
    run: ObjectiveRun, documents: np.ndarray, values: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``[B, D]`` float32 per document value the objective declares, from ``values`` (each
    one value per sequence of the rows' dataset; 0 where a row holds fewer documents)."""
    present = documents >= 0
    out: dict[str, np.ndarray] = {}
    for name in run.objective.document_values:
        if name in values:
            picked = np.asarray(values[name])[np.where(present, documents, 0)]
            out[name] = np.where(present, picked, 0.0).astype(np.float32)
    return out


def packed_rows(
    run: ObjectiveRun, batch: PackedBatch, values: Mapping[str, np.ndarray] | None = None
) -> Rows:
    """The objective's ``Rows`` of a held-out ``batch`` (numpy), its document values
    taken from ``values``."""
    return Rows(
        mask=batch.loss_mask,
        segments=batch.segments,
        documents=batch.documents,
        values=document_values(run, batch.documents, values or {}),
    )
