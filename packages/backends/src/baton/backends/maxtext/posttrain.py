"""The data stream of a MaxText run on prepared rows (an objective that does not read
text): its rows as MaxText batches and, for an objective computed by baton's loss
(``objective_loss``), each row's documents and the objective's document values; for an
objective with a stored reference (``ReferenceUse.STORED``) the reference's
log-probabilities, read from beside the data or computed once here, before the first
step.

Example::

    # after MaxText's setup: its step parts (config, model structure, mesh), train state
    batches, fingerprint = post_training_stream(config, parts, state)
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.maxtext.packed_batches import PackedBatches
from baton.backends.maxtext.reference import (
    compute_reference,
    reference_fingerprint,
    reference_params,
)
from baton.backends.maxtext.step_parts import StepParts
from baton.backends.reference_logps import stored_or_computed
from baton.core.objectives import ObjectiveRun, ReferenceUse
from baton.data import DataError
from baton.data.packed import PackedDataset, mask_path

log = logging.getLogger(__name__)

#: the document value a stored reference fills (``ReferenceUse.STORED``)
STORED_REFERENCE = "reference_logps"


def packed_fingerprint(data: PackedDataset) -> str:
    """A short hash of a prepared dataset: its manifest and the sizes of its files."""
    files = [Path(data.prefix + ".bin"), Path(data.prefix + ".idx"), mask_path(data.prefix)]
    facts = {"manifest": data.manifest, "sizes": [f.stat().st_size for f in files]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def reference_values(
    run: ObjectiveRun, parts: StepParts, state: Any, data: PackedDataset, fingerprint: str
) -> np.ndarray:
    """The reference log-probability of every sequence: stored beside the data, or
    computed now with MaxText's model, the weights of ``--reference`` (else the train
    ``state``'s: the starting weights), and stored (``stored_or_computed`` refuses values
    stored for another tokenizer or other data)."""
    given = run.values.get("reference")

    def compute() -> np.ndarray:
        log.info("computing the reference's log-probabilities of %d sequences", data.num_sequences)
        return compute_reference(parts, state, data, reference_params(parts, state, given))

    return stored_or_computed(
        data.prefix,
        fingerprint,
        tokenizer_fingerprint=data.manifest["tokenizer"]["fingerprint"],
        engine="maxtext",
        compute=compute,
        num_sequences=data.num_sequences,
    )


def post_training_stream(
    config: MaxTextConfig, parts: StepParts, state: Any
) -> tuple[PackedBatches, str]:
    """The run's batches and data fingerprint (with a stored reference, tied to the
    reference's too), from the run's config, MaxText's step parts and the train ``state``
    the reference starts from."""
    hparams = parts.hparams
    run = config.objective
    data = PackedDataset(str(config.data_path))
    length = int(hparams.max_target_length)
    if data.seq_len > length:
        raise DataError(
            f"{data.prefix} holds rows of {data.seq_len} inputs, more than the model's "
            f"max_target_length {length}; pass --seq-len {data.seq_len}"
        )
    fingerprint = packed_fingerprint(data)
    values: dict[str, np.ndarray] = {}
    if run.reference_use is ReferenceUse.STORED:
        if STORED_REFERENCE not in run.objective.document_values:
            raise ValueError(
                f"objective {run.name} stores its reference's log-probabilities but does not "
                f"declare the document value {STORED_REFERENCE!r} they fill"
            )
        weights = reference_fingerprint(config)
        values[STORED_REFERENCE] = reference_values(run, parts, state, data, weights)
        fingerprint = hashlib.sha256(f"{fingerprint}:{weights}".encode()).hexdigest()[:16]
    batches = PackedBatches(
        data,
        batch_size=int(hparams.global_batch_size_to_load),
        seed=config.data_seed,
        length=length,
        documents=not run.objective.native_cross_entropy,
        document_values=values,
    )
    return batches, fingerprint
