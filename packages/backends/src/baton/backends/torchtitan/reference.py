"""DPO's reference log-probabilities, computed once by TorchTitan before training and
kept beside the data.

For every document of a packed preference dataset, the sum of the reference model's
log-probabilities over its supervised targets, as float64 ``[num_sequences]`` in
``PREFIX.reference-<fingerprint16>.npy``, with ``PREFIX.reference-<fingerprint16>.json``
recording the reference's fingerprint, the tokenizer's, the engine and the data's. The
fingerprint covers the reference weights (the files they come from: a Hugging Face
directory's safetensors, a checkpoint's DCP files, or the seed of a fresh
initialisation), the model's architecture, the tokenizer and the data, so a changed
reference, tokenizer or dataset never reuses another's numbers.

The reference is the starting weights (what ``setup`` loaded) or another Hugging Face
directory or checkpoint, loaded into the same TorchTitan model through its checkpointer
(``dcp_load``, resharded onto this run's layout) and replaced by the starting weights
afterwards. The rows are split over the data-parallel ranks, each runs the model forward
on its share as training does (TorchTitan's ``post_dataloading_process``: positions and
the document mask), and one all-reduce gathers the sums.

Example::

    feed = pair_feed(trainer, config, source=None, writer=rank == 0)   # after setup's load
    trainer.loss_fn.feed = feed
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baton.backends.torchtitan.dpo import PairFeed, document_sums
from baton.backends.torchtitan.packed import DOCUMENT_KEYS, row_sample
from baton.core.checkpointing import file_digest
from baton.core.errors import UsageError
from baton.data.packed import PackedDataset

#: the files whose bytes are a reference's weights
WEIGHT_SUFFIXES = (".safetensors", ".distcp", ".metadata")


def weights_fingerprint(config: Any, source: str | None) -> dict[str, Any]:
    """What the reference weights are: the digests of the files at ``source`` (or of the
    starting weights' files), or the seed of a fresh initialisation."""
    from baton.backends.torchtitan.export import dcp_folder

    checkpoint = config.checkpoint
    path = source or checkpoint.initial_load_path
    if not path:
        return {"initialisation": {"seed": config.debug.seed}}
    folder = Path(path)
    if not any(folder.glob("*.safetensors")):
        folder = dcp_folder(path)
    files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise UsageError(f"{path} holds no weights; pass a Hugging Face directory or checkpoint")
    return {"files": {p.name: file_digest(p) for p in files}}


def architecture(model: Any) -> dict[str, list[int]]:
    """The model's parameters by name and global shape (the same on every layout)."""
    return {name: list(value.shape) for name, value in sorted(model.state_dict().items())}


def reference_fingerprint(
    config: Any, model: Any, source: str | None, data: PackedDataset
) -> dict[str, Any]:
    """The record a reference's log-probabilities are tied to, and its ``fingerprint``."""
    tokenizer = data.manifest.get("tokenizer", {})
    data_digest = hashlib.sha256()
    for suffix in (".json", ".idx"):
        data_digest.update(Path(data.prefix + suffix).read_bytes())
    record = {
        "engine": "torchtitan",
        "weights": weights_fingerprint(config, source),
        "source": str(source) if source else "starting weights",
        "model": architecture(model),
        "tokenizer": tokenizer.get("fingerprint"),
        "data": data_digest.hexdigest(),
    }
    spec = {key: record[key] for key in ("engine", "weights", "model", "tokenizer", "data")}
    record["fingerprint"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return record


def reference_paths(prefix: str, fingerprint: str) -> tuple[Path, Path]:
    """``(PREFIX.reference-<fp16>.npy, PREFIX.reference-<fp16>.json)``."""
    stem = f"{prefix}.reference-{fingerprint[:16]}"
    return Path(stem + ".npy"), Path(stem + ".json")


def read_stored(prefix: str, record: dict[str, Any], num_sequences: int) -> np.ndarray | None:
    """The stored log-probabilities for ``record``, or None if there are none yet."""
    values, meta = reference_paths(prefix, record["fingerprint"])
    if not (values.is_file() and meta.is_file()):
        return None
    stored = json.loads(meta.read_text())
    if stored.get("fingerprint") != record["fingerprint"]:
        raise UsageError(
            f"{meta} belongs to another reference, tokenizer or dataset; delete "
            f"{values.name} and {meta.name} to compute them again"
        )
    logps = np.load(values)
    if logps.shape != (num_sequences,):
        raise UsageError(f"{values} does not fit {prefix}; delete it to compute it again")
    return logps


def write_stored(prefix: str, record: dict[str, Any], logps: np.ndarray) -> None:
    """Write the log-probabilities and their record (temporaries renamed, json last)."""
    values, meta = reference_paths(prefix, record["fingerprint"])
    partial = f".partial-{os.getpid()}"
    with open(str(values) + partial, "wb") as file:
        np.save(file, logps)
    Path(str(meta) + partial).write_text(json.dumps(record, indent=2, sort_keys=True))
    os.replace(str(values) + partial, values)
    os.replace(str(meta) + partial, meta)


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


def pair_feed(trainer: Any, config: Any, source: str | None, *, writer: bool) -> PairFeed:
    """The ``PairFeed`` of a DPO run: the stored reference log-probabilities for this
    reference and data, or computed now (and written by the ``writer`` rank)."""
    from torchtitan.distributed import utils as dist_utils

    dims = trainer.parallel_dims
    if dims.pp_enabled or dims.cp_enabled:
        raise UsageError(
            "--objective dpo on TorchTitan runs with data and tensor parallelism; "
            "use --pp 1 (and no context parallelism)"
        )
    data: PackedDataset = trainer.dataloader.dataset.data
    mesh = dims.get_mesh("batch") if dims.dp_enabled else None

    def all_reduce(value: torch.Tensor) -> torch.Tensor:
        return value if mesh is None else dist_utils.dist_sum_tensor(value, mesh)

    record = reference_fingerprint(config, trainer.model_parts[0], source, data)
    logps = read_stored(data.prefix, record, data.num_sequences)
    if logps is None:
        logps = compute_reference_logps(
            trainer, data, source=source, batch_size=config.training.local_batch_size,
            rank=0 if mesh is None else mesh.get_local_rank(),
            ranks=1 if mesh is None else mesh.size(), all_reduce=all_reduce,
        )  # fmt: skip
        if writer:
            write_stored(data.prefix, record, logps)
    return PairFeed(torch.from_numpy(logps), count=all_reduce)
