"""A reference model's log-probabilities of every document of the data, computed once by
TorchTitan before training and kept beside the data (an objective whose reference use is
``ReferenceUse.STORED``: DPO's ``reference_logps`` document value).

Which weights the reference is, their check and their fingerprint are the engines'
shared ``baton.backends.reference_model``; a run that starts from a random
initialisation is fingerprinted by its seed and parameter shapes. What is TorchTitan's own
is the scorer: the reference weights are the starting weights (what ``setup`` loaded) or
another Hugging Face directory or checkpoint, loaded into the same TorchTitan model
through its checkpointer (``dcp_load``, resharded onto this run's layout) and replaced by
the starting weights afterwards. The rows are split over the data-parallel ranks, each
runs the model forward on its share as training does (TorchTitan's
``post_dataloading_process``: positions and the document mask), the log-probabilities
of each document's supervised targets at the objective's temperature are summed
(``compute_logprobs``, as the loss computes them), and one all-reduce gathers the sums.
``reference_logps.stored_or_computed`` keeps them as ``PREFIX.reference-<fp16>.npy``
with their record, or reads them back.

Example::

    stored = stored_document_values(trainer, config, run, init_from="hf-model/")
    feed = RowFeed(run, count=all_reduce, stored=stored)   # {"reference_logps": [N]}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchtitan.components.loss import IGNORE_INDEX

from baton.backends.reference_logps import stored_or_computed
from baton.backends.reference_model import reference_fingerprint, reference_source
from baton.backends.torchtitan.packed import DOCUMENT_KEYS, row_sample
from baton.backends.torchtitan.token_logps import TORCH, token_logps
from baton.core.objectives import ObjectiveRun, ReferenceUse
from baton.core.objectives.array_math import document_sums
from baton.data.packed import PackedDataset

#: the document value a stored reference gives (``ReferenceUse.STORED``)
REFERENCE_LOGPS = "reference_logps"


def fresh_facts(config: Any, model: Any) -> dict[str, Any]:
    """What decides a random initialisation's weights: the seed and every parameter's
    shape (the fingerprint of a reference that is such a start)."""
    shapes = {name: list(value.shape) for name, value in sorted(model.state_dict().items())}
    return {"engine": "torchtitan", "seed": config.debug.seed, "parameters": shapes}


def _rows_of_rank(num_rows: int, rank: int, ranks: int, batch_size: int) -> list[list[int]]:
    """This rank's rows in batches; every rank gets the same number of batches (FSDP's
    forward is collective), a rank out of rows repeats row 0 (marked -1, dropped)."""
    mine = list(range(rank, num_rows, ranks))
    batches = math.ceil(math.ceil(num_rows / ranks) / batch_size)
    padded = mine + [-1] * (batches * batch_size - len(mine))
    return [padded[i * batch_size : (i + 1) * batch_size] for i in range(batches)]


@torch.no_grad()
def forward_logps(
    trainer: Any,
    data: PackedDataset,
    rows: list[list[int]],
    out: torch.Tensor,
    temperature: float = 1.0,
) -> None:
    """Fill ``out`` (``[num_sequences]``) with the model's document log-probabilities of
    ``rows`` (the sum over each document's supervised targets at ``temperature``), each
    batch through TorchTitan's own input processing and model."""
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
        logps, _ = token_logps(pred, labels, temperature)
        mask = (labels != IGNORE_INDEX).to(torch.float32)
        sums = document_sums(TORCH, logps * mask, segments, documents.shape[1])
        keep = (documents >= 0) & (torch.tensor(batch, device=documents.device) >= 0)[:, None]
        out[documents[keep].cpu()] = sums[keep].double().cpu()
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
    temperature: float = 1.0,
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
    rows = _rows_of_rank(data.num_rows, rank, ranks, batch_size)
    try:
        forward_logps(trainer, data, rows, out, temperature)
    finally:
        if starting is not None:
            wrapper.load_state_dict(starting)
    return all_reduce(out.to(trainer.device)).cpu().numpy()


def stored_document_values(
    trainer: Any,
    config: Any,
    run: ObjectiveRun,
    *,
    init_from: str | None,
    all_reduce: Callable[[torch.Tensor], torch.Tensor],
    rank: int = 0,
    ranks: int = 1,
    data: PackedDataset | None = None,
) -> dict[str, torch.Tensor]:
    """The per-document values ``run`` reads from beside the data: with a stored
    reference, ``{"reference_logps": [num_sequences]}``, read if this reference's file is
    there, else computed now on every rank and written (every rank writes the same
    numbers, atomically); nothing otherwise. ``init_from``: the run's starting weights
    as given (``--init-from``; the reference unless ``--reference`` names one).
    ``data``: other prepared rows than the training data's (held-out rows of their own),
    whose values are kept beside them."""
    if run.reference_use is not ReferenceUse.STORED:
        return {}
    if data is None:  # every row of the training data, held-out rows included
        data = trainer.dataloader.dataset.data.whole
    source = reference_source(run, init_from)
    fingerprint = reference_fingerprint(source, fresh=fresh_facts(config, trainer.model_parts[0]))
    given = run.values.get("reference")  # other weights than the starting ones
    logps = stored_or_computed(
        data.prefix,
        fingerprint,
        tokenizer_fingerprint=data.manifest.get("tokenizer", {}).get("fingerprint", ""),
        engine="torchtitan",
        compute=lambda: compute_reference_logps(
            trainer, data, source=str(given) if given else None,
            batch_size=config.training.local_batch_size, rank=rank, ranks=ranks,
            all_reduce=all_reduce, temperature=run.temperature,
        ),
        num_sequences=data.num_sequences,
    )  # fmt: skip
    return {REFERENCE_LOGPS: torch.from_numpy(logps)}
