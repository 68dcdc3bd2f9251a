"""Held-out rows of an SFT or DPO run on TorchTitan, and their evaluation.

Nothing is held out unless asked: ``set_held_out`` puts ``--eval-split F`` (the last
rows of the training data, which the training loader then leaves out) or
``--eval-data-path PREFIX`` (other prepared data of the same kind) on the run's
``PackedDataLoader.Config``, checked before anything is built. SFT's held-out rows are
TorchTitan's validator's data: its loss is the sum of the cross entropy over their
supervised tokens over their count, one mean over all of them (a rank with fewer rows
reads rows with nothing supervised, so every rank runs as many forwards). DPO's are
``HeldOut``'s: every held-out row through TorchTitan's own input processing and model
(the forward DPO's reference takes, ``reference.forward_logps``), split over the
data-parallel ranks, then TRL's loss and metrics over all their pairs
(``baton.backends.posttrain_evaluation``). A DPO run's held-out rows of another dataset
get their reference log-probabilities before the first step, stored beside that data as
the training data's are.

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
    ``eval_data_path``; refused in one line (``DataError``) when it does not fit. SFT's
    are read by TorchTitan's validator (``config.validator``, one full pass: the loss
    summed over the supervised tokens of every held-out row over their count); DPO's by
    ``HeldOut``."""
    loader = config.dataloader
    if not isinstance(loader, PackedDataLoader.Config) or not loader.dataset_path:
        raise UsageError("held-out rows need packed post-training data (--objective sft|dpo)")
    held_out_rows(
        PackedDataset(loader.dataset_path), eval_split=eval_split, eval_data_path=eval_data_path
    )  # checked now, before anything is built
    loader.eval_split = eval_split
    loader.eval_data_path = eval_data_path
    if loader.documents:  # DPO: HeldOut evaluates its pairs
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
    """A DPO run's held-out pairs with their reference log-probabilities."""

    def __init__(self, data: PackedDataset, reference: np.ndarray, loss: Any) -> None:
        self.data, self.reference = data, reference
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
        """A DPO run's held-out pairs (``None`` when none, and for SFT, whose held-out
        rows TorchTitan's validator reads), with the training data's reference where
        they are its rows (``pairs``, the run's ``PairFeed``), else their own, computed
        now (before any step: the reference's weights are ``source``'s or the starting
        ones) or read from beside them."""
        data = held_out_data(config)
        if data is None or pairs is None:
            return None
        if trainer.parallel_dims.pp_enabled or trainer.parallel_dims.cp_enabled:
            raise UsageError(
                "evaluating held-out pairs on TorchTitan runs with data and tensor "
                "parallelism; use --pp 1 (and no context parallelism), or --eval-every 0"
            )
        if data.whole.prefix == trainer.dataloader.dataset.data.whole.prefix:
            return cls(data, pairs.reference.numpy(), trainer.loss_fn)
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
        return cls(data, reference, trainer.loss_fn)

    def evaluate(self, trainer: Any, batch_size: int) -> dict[str, float]:
        """DPO's loss and metrics over every held-out pair, under the current weights,
        the model in eval mode for the pass."""
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
            self.data, logps, objective="dpo", reference=self.reference,
            beta=self.beta, loss_type=self.loss_type,
        )  # fmt: skip
