"""The data stream of an SFT or DPO run on MaxText: prepared rows as MaxText batches, and
for DPO the reference's log-probabilities (read from beside the data, or computed once
here, before the first step).

Example::

    batches, fingerprint = post_training_stream(backend)   # after MaxText's setup
    backend.batches, backend.data_fingerprint = batches, fingerprint
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from baton.backends.maxtext.packed_batches import PackedBatches
from baton.backends.maxtext.reference import (
    compute_reference,
    reference_fingerprint,
    reference_params,
)
from baton.backends.reference_logps import stored_or_computed
from baton.data import DataError
from baton.data.packed import PackedDataset, mask_path

log = logging.getLogger(__name__)


def packed_fingerprint(data: PackedDataset) -> str:
    """A short hash of a prepared dataset: its manifest and the sizes of its files."""
    files = [Path(data.prefix + ".bin"), Path(data.prefix + ".idx"), mask_path(data.prefix)]
    facts = {"manifest": data.manifest, "sizes": [f.stat().st_size for f in files]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def reference_values(backend: Any, data: PackedDataset, fingerprint: str) -> Any:
    """The reference log-probability of every sequence: stored beside the data, or
    computed with MaxText's model now and stored (``stored_or_computed`` refuses values
    stored for another tokenizer or other data)."""
    config = backend.config

    def compute() -> Any:
        log.info(
            "computing the DPO reference's log-probabilities of %d sequences", data.num_sequences
        )
        return compute_reference(backend, data, reference_params(backend, config.reference))

    return stored_or_computed(
        data.prefix,
        fingerprint,
        tokenizer_fingerprint=data.manifest["tokenizer"]["fingerprint"],
        engine="maxtext",
        compute=compute,
        num_sequences=data.num_sequences,
    )


def post_training_stream(backend: Any) -> tuple[PackedBatches, str]:
    """The run's batches and data fingerprint (for DPO tied to the reference's too)."""
    config, hparams = backend.config, backend.hparams
    data = PackedDataset(str(config.data_path))
    length = int(hparams.max_target_length)
    if data.seq_len > length:
        raise DataError(
            f"{data.prefix} holds rows of {data.seq_len} inputs, more than the model's "
            f"max_target_length {length}; pass --seq-len {data.seq_len}"
        )
    fingerprint = packed_fingerprint(data)
    reference = None
    if config.objective == "dpo":
        source = config.reference or config.init_from
        weights = reference_fingerprint(source, hparams)
        reference = reference_values(backend, data, weights)
        fingerprint = hashlib.sha256(f"{fingerprint}:{weights}".encode()).hexdigest()[:16]
    batches = PackedBatches(
        data,
        batch_size=int(hparams.global_batch_size_to_load),
        seed=config.data_seed,
        length=length,
        reference=reference,
    )
    return batches, fingerprint
