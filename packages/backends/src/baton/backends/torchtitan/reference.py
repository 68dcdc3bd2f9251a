"""DPO's reference log-probabilities, computed once by TorchTitan before training and
kept beside the data.

For every document of a packed preference dataset, the sum of the reference model's
log-probabilities over its supervised targets, float64 ``[num_sequences]``, stored by
the engines' shared ``baton.backends.reference_logps`` as
``PREFIX.reference-<fingerprint16>.npy`` with its record (the reference's, the
tokenizer's and the data's fingerprints, the engine). The fingerprint is the reference
weights' files (a Hugging Face directory, a checkpoint; for a fresh initialisation its
seed and parameter shapes); a stored file made with another tokenizer or data is
refused.

The reference is the starting weights (what ``setup`` loaded) or another Hugging Face
directory or checkpoint, loaded into the same TorchTitan model through its checkpointer
(``dcp_load``, resharded onto this run's layout) and replaced by the starting weights
afterwards. The rows are split over the data-parallel ranks, each runs the model forward
on its share as training does (TorchTitan's ``post_dataloading_process``: positions and
the document mask), and one all-reduce gathers the sums.

Example::

    feed = pair_feed(trainer, config, source=None)   # after setup loaded the weights
    trainer.loss_fn.feed = feed
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baton.backends.reference_logps import model_fingerprint, stored_or_computed
from baton.backends.torchtitan.dpo import PairFeed, document_sums
from baton.backends.torchtitan.packed import DOCUMENT_KEYS, row_sample
from baton.core.errors import UsageError
from baton.data.packed import PackedDataset


def reference_fingerprint(config: Any, model: Any, source: str | None) -> str:
    """The fingerprint of the reference weights: the files at ``source`` (or of the
    starting weights, ``--init-from``), through the engines' shared ``model_fingerprint``;
    a fresh initialisation's seed and architecture where no file holds them."""
    path = source or config.checkpoint.initial_load_path
    if path:
        return model_fingerprint(path)
    shapes = {name: list(value.shape) for name, value in sorted(model.state_dict().items())}
    fresh = {"engine": "torchtitan", "seed": config.debug.seed, "parameters": shapes}
    return hashlib.sha256(json.dumps(fresh, sort_keys=True).encode()).hexdigest()


def _rows_of_rank(num_rows: int, rank: int, ranks: int, batch_size: int) -> list[list[int]]:
    """This rank's rows in batches; every rank gets the same number of batches (FSDP's
    forward is collective), a rank out of rows repeats row 0 (marked -1, dropped)."""
    mine = list(range(rank, num_rows, ranks))
    batches = math.ceil(math.ceil(num_rows / ranks) / batch_size)
    padded = mine + [-1] * (batches * batch_size - len(mine))
    return [padded[i * batch_size : (i + 1) * batch_size] for i in range(batches)]


@torch.no_grad()
def forward_logps(
    trainer: Any, data: PackedDataset, rows: list[list[int]], out: torch.Tensor
) -> None:
    """Fill ``out`` (``[num_sequences]``) with the model's document log-probabilities of
    ``rows``, each batch through TorchTitan's own input processing and model."""
    model = trainer.model_parts[0]
    seen = trainer.ntokens_seen
    for batch in rows:
        samples = [row_sample(data, max(row, 0), documents=True) for row in batch]
        inputs = {
            key: torch.stack([s[0][key] for s in samples]).to(trainer.device)
            for key in samples[0][0]
        }
        labels = torch.stack([s[1] for s in samples]).to(trainer.device)
        segments, documents = (inputs.pop(key) for key in DOCUMENT_KEYS)
        tokens, labels, extra = trainer.post_dataloading_process(inputs, labels)
        with trainer.train_context():
            pred = model(tokens, **extra)
        logps, _ = document_sums(pred, labels, segments, documents.shape[1])
        keep = (documents >= 0) & (torch.tensor(batch, device=documents.device) >= 0)[:, None]
        out[documents[keep].cpu()] = logps[keep].double().cpu()
    trainer.ntokens_seen = seen


def load_reference_weights(trainer: Any, source: str) -> None:
    """Load ``source`` (a Hugging Face directory or checkpoint) into the model, through
    TorchTitan's checkpointer."""
    from torchtitan.components.checkpointer import MODEL

    from baton.backends.torchtitan.export import dcp_folder

    checkpointer = trainer.checkpointer
    state = checkpointer.states[MODEL].state_dict()
    from_hf = any(Path(source).glob("*.safetensors"))
    folder = Path(source).resolve() if from_hf else dcp_folder(source).resolve()
    checkpointer.dcp_load(state, checkpoint_id=str(folder), from_hf=from_hf, from_quantized=False)


def compute_reference_logps(
    trainer: Any,
    data: PackedDataset,
    *,
    source: str | None,
    batch_size: int,
    rank: int,
    ranks: int,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
) -> np.ndarray:
    """The reference log-probabilities of every document of ``data``, computed on every
    data-parallel rank (``rank`` of ``ranks``; ``all_reduce`` sums over them). With a
    ``source`` its weights are loaded first and the starting weights put back after."""
    from torchtitan.components.checkpointer import MODEL

    wrapper = trainer.checkpointer.states[MODEL]
    starting = None
    if source is not None:
        starting = {k: v.detach().clone() for k, v in wrapper.state_dict().items()}
        load_reference_weights(trainer, source)
    out = torch.zeros(data.num_sequences, dtype=torch.float64)
    try:
        forward_logps(trainer, data, _rows_of_rank(data.num_rows, rank, ranks, batch_size), out)
    finally:
        if starting is not None:
            wrapper.load_state_dict(starting)
    return all_reduce(out.to(trainer.device)).cpu().numpy()


def pair_feed(
    trainer: Any, config: Any, source: str | None, fingerprint: str | None = None
) -> PairFeed:
    """The ``PairFeed`` of a DPO run: the stored reference log-probabilities for this
    reference, or computed now on every rank and written (every rank writes the same
    numbers, atomically: ``reference_logps.stored_or_computed``). ``fingerprint``: the
    reference's, if the recipe already took it (``objective.reference_fingerprint``)."""
    from torchtitan.distributed import utils as dist_utils

    dims = trainer.parallel_dims
    if dims.pp_enabled or dims.cp_enabled:
        raise UsageError(
            "--objective dpo on TorchTitan runs with data and tensor parallelism; "
            "use --pp 1 (and no context parallelism)"
        )
    data: PackedDataset = trainer.dataloader.dataset.data.whole  # held-out rows included
    mesh = dims.get_mesh("batch") if dims.dp_enabled else None

    def all_reduce(value: torch.Tensor) -> torch.Tensor:
        return value if mesh is None else dist_utils.dist_sum_tensor(value, mesh)

    logps = stored_or_computed(
        data.prefix,
        fingerprint or reference_fingerprint(config, trainer.model_parts[0], source),
        tokenizer_fingerprint=data.manifest.get("tokenizer", {}).get("fingerprint", ""),
        engine="torchtitan",
        compute=lambda: compute_reference_logps(
            trainer, data, source=source, batch_size=config.training.local_batch_size,
            rank=0 if mesh is None else mesh.get_local_rank(),
            ranks=1 if mesh is None else mesh.size(), all_reduce=all_reduce,
        ),
        num_sequences=data.num_sequences,
    )  # fmt: skip
    return PairFeed(torch.from_numpy(logps), count=all_reduce)
