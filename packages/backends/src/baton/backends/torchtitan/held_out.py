"""Held-out rows of an SFT or DPO run on TorchTitan, and their evaluation.

Nothing is held out unless asked: ``set_held_out`` puts ``--eval-split F`` (the last
rows of the training data, which the training loader then leaves out) or
``--eval-data-path PREFIX`` (other prepared data of the same kind) on the run's
``PackedDataLoader.Config``, checked before anything is built. ``HeldOut`` evaluates
them: every held-out row through TorchTitan's own input processing and model (the
forward DPO's reference takes, ``reference.forward_logps``), split over the
data-parallel ranks, then the objective's loss over all of them
(``baton.backends.posttrain_evaluation``: SFT the mean over their supervised tokens,
DPO TRL's loss and metrics over their pairs). A DPO run's held-out rows of another
dataset get their reference log-probabilities before the first step, stored beside
that data as the training data's are.

Example::

    set_held_out(config, eval_split=0.1)                 # the recipe, before the build
    held = HeldOut.of(trainer, config, pairs=feed, source=None, fingerprint=None)
    held.evaluate(trainer)                               # {"loss": ..., "rewards/...": ...}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from baton.backends.posttrain_evaluation import evaluation_metrics
from baton.backends.torchtitan.packed import PackedDataLoader
from baton.core.errors import UsageError
from baton.data.packed import PackedDataset, held_out_rows


def set_held_out(
    config: Any, *, eval_split: float = 0.0, eval_data_path: str | None = None
) -> None:
    """Hold rows of the run's packed data out for evaluation (``config.dataloader``, a
    ``PackedDataLoader.Config``): the last ``eval_split`` of them, or the prepared data at
    ``eval_data_path``; refused in one line (``DataError``) when it does not fit."""
    loader = config.dataloader
    if not isinstance(loader, PackedDataLoader.Config) or not loader.dataset_path:
        raise UsageError("held-out rows need packed post-training data (--objective sft|dpo)")
    held_out_rows(
        PackedDataset(loader.dataset_path), eval_split=eval_split, eval_data_path=eval_data_path
    )  # checked now, before anything is built
    loader.eval_split = eval_split
    loader.eval_data_path = eval_data_path


def holds_rows_out(config: Any) -> bool:
    """Whether ``config``'s packed data holds rows out for evaluation (no file read)."""
    loader = config.dataloader
    return isinstance(loader, PackedDataLoader.Config) and bool(
        loader.eval_split or loader.eval_data_path is not None
    )


def held_out_data(config: Any) -> PackedDataset | None:
    """The rows ``config`` holds out for evaluation (``None``: every row trains)."""
    loader = config.dataloader
    if not isinstance(loader, PackedDataLoader.Config) or not loader.dataset_path:
        return None
    data = PackedDataset(loader.dataset_path)
    return held_out_rows(data, eval_split=loader.eval_split, eval_data_path=loader.eval_data_path)[
        1
    ]


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
    """A run's held-out rows with, for DPO, their reference log-probabilities."""

    def __init__(
        self, data: PackedDataset, objective: str, reference: np.ndarray | None, loss: Any
    ) -> None:
        self.data, self.objective, self.reference = data, objective, reference
        self.beta = float(getattr(loss, "beta", 0.1))
        self.loss_type = str(getattr(loss, "loss_type", "sigmoid"))

    @classmethod
    def of(
        cls,
        trainer: Any,
        config: Any,
        *,
        pairs: Any = None,
        source: str | None = None,
        fingerprint: str | None = None,
    ) -> HeldOut | None:
        """The run's held-out rows (``None`` when none): for DPO (``pairs``, the run's
        ``PairFeed``) with the training data's reference where they are its rows, else
        their own, computed now (before any step: the reference's weights are
        ``source``'s or the starting ones) or read from beside them."""
        data = held_out_data(config)
        if data is None:
            return None
        if trainer.parallel_dims.pp_enabled or trainer.parallel_dims.cp_enabled:
            raise UsageError(
                "evaluating held-out rows on TorchTitan runs with data and tensor "
                "parallelism; use --pp 1 (and no context parallelism), or --eval-every 0"
            )
        if pairs is None:
            return cls(data, "sft", None, trainer.loss_fn)
        if data.whole.prefix == trainer.dataloader.dataset.data.whole.prefix:
            return cls(data, "dpo", pairs.reference.numpy(), trainer.loss_fn)
        from baton.backends.reference_logps import stored_or_computed
        from baton.backends.torchtitan.reference import (
            compute_reference_logps,
            reference_fingerprint,
        )

        rank, ranks, all_reduce = data_parallel(trainer)
        reference = stored_or_computed(
            data.prefix,
            fingerprint or reference_fingerprint(config, trainer.model_parts[0], source),
            tokenizer_fingerprint=data.manifest.get("tokenizer", {}).get("fingerprint", ""),
            engine="torchtitan",
            compute=lambda: compute_reference_logps(
                trainer, data, source=source, batch_size=config.training.local_batch_size,
                rank=rank, ranks=ranks, all_reduce=all_reduce,
            ),
            num_sequences=data.num_sequences,
        )  # fmt: skip
        return cls(data, "dpo", reference, trainer.loss_fn)

    def evaluate(self, trainer: Any, batch_size: int) -> dict[str, float]:
        """The objective's loss (and DPO's metrics) over every held-out row, under the
        current weights, the model in eval mode for the pass."""
        from baton.backends.torchtitan.reference import compute_reference_logps

        rank, ranks, all_reduce = data_parallel(trainer)
        model = trainer.model_parts[0]
        model.eval()
        try:
            logps = compute_reference_logps(
                trainer, self.data, source=None, batch_size=batch_size,
                rank=rank, ranks=ranks, all_reduce=all_reduce,
            )  # fmt: skip
        finally:
            model.train()
        return evaluation_metrics(
            self.data, logps, objective=self.objective, reference=self.reference,
            beta=self.beta, loss_type=self.loss_type,
        )  # fmt: skip
