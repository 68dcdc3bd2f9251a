"""Held-out rows of a post-training run on TorchTitan, and their evaluation.

Nothing is held out unless asked: ``set_held_out`` puts ``--eval-split F`` (the last
rows of the training data, which the training loader then leaves out) or
``--eval-data-path PREFIX`` (other prepared data of the same kind) on the run's
``PackedDataLoader.Config``, checked before anything is built. The evaluation is the
run's objective loss over every held-out row:

- an objective that is TorchTitan's own cross entropy (``native_cross_entropy``: SFT)
  is evaluated by TorchTitan's validator on those rows: its loss is the sum of the cross
  entropy over their supervised tokens over their count, one mean over all of them (a
  rank with fewer rows reads rows with nothing supervised, so every rank runs as many
  forwards);
- any other objective by ``HeldOut``: every held-out row through TorchTitan's own input
  processing and model, split over the data-parallel ranks, the objective's declared
  loss on what training hands it (``token_logps``: the targets' log-probabilities at its
  temperature), its total, items and metrics added over every row and rank
  (``baton.backends.posttrain_evaluation``). Held-out rows of another dataset get their
  stored values (a reference's log-probabilities) before the first step, kept beside
  that data as the training data's are.

Example::

    set_held_out(config, run, eval_split=0.1)            # the recipe, before the build
    held = HeldOut.of(trainer, config, run, feed=row_feed, init_from=None)
    held.evaluate(trainer, batch_size=8)                 # {"loss": ..., "rewards/...": ...}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torchtitan.components.loss import IGNORE_INDEX

from baton.backends.posttrain_evaluation import (
    evaluation_means,
    evaluation_sums,
    held_out_batch,
    packed_rows,
    row_batches,
)
from baton.backends.torchtitan.packed import PackedDataLoader
from baton.backends.torchtitan.token_logps import TORCH, token_logps
from baton.core.errors import UsageError
from baton.core.objectives import LossInputs, ObjectiveRun, Rows
from baton.data.packed import PackedDataset, held_out_rows


def set_held_out(
    config: Any, run: ObjectiveRun, *, eval_split: float = 0.0, eval_data_path: str | None = None
) -> None:
    """Hold rows of the run's packed data out for evaluation (``config.dataloader``, a
    ``PackedDataLoader.Config``): the last ``eval_split`` of them, or the prepared data at
    ``eval_data_path``; refused in one line (``DataError``) when it does not fit. An
    objective with TorchTitan's own cross entropy has them read by TorchTitan's validator
    (``config.validator``, one full pass); any other by ``HeldOut``."""
    loader = config.dataloader
    if not isinstance(loader, PackedDataLoader.Config) or not loader.dataset_path:
        raise UsageError(
            f"held-out rows of --objective {run.name} need its prepared rows (--data-path)"
        )
    held_out_rows(
        PackedDataset(loader.dataset_path),
        run.name,
        eval_split=eval_split,
        eval_data_path=eval_data_path,
    )  # fmt: skip  (checked now, before anything is built)
    loader.eval_split = eval_split
    loader.eval_data_path = eval_data_path
    if not run.objective.native_cross_entropy:  # HeldOut evaluates the declared loss
        return
    config.validator.dataloader = PackedDataLoader.Config(
        dataset_path=eval_data_path or loader.dataset_path,
        eval_split=0.0 if eval_data_path else eval_split,
        split="eval",
        infinite=False,
    )
    config.validator.steps = -1
    config.validator.enable = True


def holds_rows_out(config: Any) -> bool:
    """Whether ``config``'s packed data holds rows out for evaluation (no file read)."""
    loader = config.dataloader
    return isinstance(loader, PackedDataLoader.Config) and bool(
        loader.eval_split or loader.eval_data_path is not None
    )


def held_out_data(config: Any, run: ObjectiveRun) -> PackedDataset | None:
    """The rows ``config`` holds out for evaluation (``None``: every row trains)."""
    loader = config.dataloader
    if not isinstance(loader, PackedDataLoader.Config) or not loader.dataset_path:
        return None
    data = PackedDataset(loader.dataset_path)
    return held_out_rows(
        data, run.name, eval_split=loader.eval_split, eval_data_path=loader.eval_data_path
    )[1]


def data_parallel(trainer: Any) -> tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]:
    """``(rank, ranks, sum over them)`` of the data-parallel ranks that read distinct rows."""
    from torchtitan.distributed import utils as dist_utils

    dims = trainer.parallel_dims
    mesh = dims.get_mesh("batch") if dims.dp_enabled else None

    def all_reduce(value: torch.Tensor) -> torch.Tensor:
        return value if mesh is None else dist_utils.dist_sum_tensor(value, mesh)

    if mesh is None:
        return 0, 1, all_reduce
    return mesh.get_local_rank(), mesh.size(), all_reduce


class HeldOut:
    """A run's held-out rows, with the values their objective reads per document."""

    def __init__(
        self, run: ObjectiveRun, data: PackedDataset, values: Mapping[str, np.ndarray]
    ) -> None:
        self.run, self.data, self.values = run, data, dict(values)

    @classmethod
    def of(
        cls,
        trainer: Any,
        config: Any,
        run: ObjectiveRun,
        *,
        stored: Mapping[str, torch.Tensor],
        init_from: str | None,
    ) -> HeldOut | None:
        """The held-out rows of a run of an objective with a loss of its own (``None``
        when none are held out, and for TorchTitan's own cross entropy, whose held-out rows
        its validator reads): with the values kept beside the training data (``stored``,
        the run's ``RowFeed``'s) where they are its rows, else their own, read from beside
        them or computed now (before any step, on the starting weights' model)."""
        if run.objective.native_cross_entropy:
            return None
        data = held_out_data(config, run)
        if data is None:
            return None
        if trainer.parallel_dims.pp_enabled or trainer.parallel_dims.cp_enabled:
            raise UsageError(
                "evaluating held-out rows on TorchTitan runs with data and tensor "
                "parallelism; use --pp 1 (and no context parallelism), or --eval-every 0"
            )
        if data.whole.prefix != trainer.dataloader.dataset.data.whole.prefix:
            from baton.backends.torchtitan.reference import stored_document_values

            rank, ranks, all_reduce = data_parallel(trainer)
            stored = stored_document_values(
                trainer, config, run, init_from=init_from, all_reduce=all_reduce,
                rank=rank, ranks=ranks, data=data.whole,
            )  # fmt: skip
        return cls(run, data, {name: value.numpy() for name, value in stored.items()})

    @torch.no_grad()
    def evaluate(self, trainer: Any, batch_size: int) -> dict[str, float]:
        """The objective's loss and metrics over every held-out row, under the current
        weights, the model in eval mode for the pass."""
        rank, ranks, all_reduce = data_parallel(trainer)
        model, run = trainer.model_parts[0], self.run
        seen = trainer.ntokens_seen
        sums = torch.zeros(2 + 2 * len(run.objective.metrics), device=trainer.device)
        model.eval()
        try:
            for rows in row_batches(self.data.num_rows, batch_size, rank=rank, ranks=ranks):
                batch = held_out_batch(self.data, rows)
                inputs = {
                    "input": torch.from_numpy(batch.inputs).to(trainer.device),
                    "positions": torch.from_numpy(batch.positions.astype(np.int64)).to(
                        trainer.device
                    ),
                }
                targets = np.where(batch.loss_mask, batch.targets, IGNORE_INDEX)
                labels = torch.from_numpy(targets).to(trainer.device)
                tokens, labels, extra = trainer.post_dataloading_process(inputs, labels)
                with trainer.train_context():
                    pred = model(tokens, **extra)
                logps, entropy = token_logps(
                    pred, labels, run.temperature, entropy=run.objective.entropy
                )
                rows_of = self._rows(batch, logps.device)
                sums += evaluation_sums(TORCH, run, LossInputs(rows_of, logps, entropy))
        finally:
            model.train()
            trainer.ntokens_seen = seen
        return evaluation_means(run, all_reduce(sums).cpu().numpy())

    def _rows(self, batch: Any, device: torch.device) -> Rows:
        """The batch's ``Rows`` as torch tensors on ``device``."""
        rows = packed_rows(self.run, batch, self.values)
        return Rows(
            mask=torch.from_numpy(rows.mask).to(device),
            segments=torch.from_numpy(rows.segments.astype(np.int64)).to(device),
            documents=torch.from_numpy(rows.documents).to(device),
            values={name: torch.from_numpy(v).to(device) for name, v in rows.values.items()},
        )
