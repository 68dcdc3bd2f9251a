"""The data stream of an SFT or DPO run on MaxText: prepared rows as MaxText batches, and
for DPO the reference's log-probabilities (read from beside the data, or computed once
here, before the first step).

Every row trains unless rows are held out for evaluation (``config.eval_split``: the
last rows; ``config.eval_data_path``: other prepared data); ``HeldOutRows`` evaluates
them with MaxText's model (the forward DPO's reference takes, ``compute_reference``) as
the objective's loss over all of them (``baton.backends.posttrain_evaluation``).

Example::

    # after MaxText's setup: its step parts (config, model structure, mesh), train state
    batches, fingerprint, held = post_training_stream(config, parts, state)
    held.evaluate(parts, state) if held else None    # {"loss": ..., ...}
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.maxtext.packed_batches import PackedBatches
from baton.backends.maxtext.reference import (
    compute_reference,
    reference_fingerprint,
    reference_params,
)
from baton.backends.maxtext.step_parts import StepParts
from baton.backends.posttrain_evaluation import evaluation_metrics
from baton.backends.reference_logps import stored_or_computed
from baton.data import DataError
from baton.data.packed import PackedDataset, held_out_rows, mask_path

log = logging.getLogger(__name__)


def packed_fingerprint(data: PackedDataset) -> str:
    """A short hash of a prepared dataset: its manifest and the sizes of its files."""
    files = [Path(data.prefix + ".bin"), Path(data.prefix + ".idx"), mask_path(data.prefix)]
    facts = {"manifest": data.manifest, "sizes": [f.stat().st_size for f in files]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def reference_values(
    source: str | None, parts: StepParts, state: Any, data: PackedDataset, fingerprint: str
) -> Any:
    """The reference log-probability of every sequence: stored beside the data, or
    computed now with MaxText's model, the weights of ``source`` (``None``: the train
    ``state``'s), and stored (``stored_or_computed`` refuses values stored for another
    tokenizer or other data)."""

    def compute() -> Any:
        log.info(
            "computing the DPO reference's log-probabilities of %d sequences", data.num_sequences
        )
        return compute_reference(parts, state, data, reference_params(parts, state, source))

    return stored_or_computed(
        data.prefix,
        fingerprint,
        tokenizer_fingerprint=data.manifest["tokenizer"]["fingerprint"],
        engine="maxtext",
        compute=compute,
        num_sequences=data.num_sequences,
    )


@dataclass(frozen=True)
class HeldOutRows:
    """A run's held-out rows (and, for DPO, the reference's log-probabilities of their
    documents) and how they are evaluated."""

    data: PackedDataset
    config: MaxTextConfig
    reference: Any = None

    def evaluate(self, parts: StepParts, state: Any) -> dict[str, float]:
        """The objective's loss (DPO: and TRL's metrics) over every held-out row, with
        the train ``state``'s weights."""
        logps = compute_reference(parts, state, self.data, None)
        return evaluation_metrics(
            self.data, logps, objective=self.config.objective, reference=self.reference,
            beta=self.config.dpo_beta, loss_type=self.config.dpo_loss,
        )  # fmt: skip


def post_training_stream(
    config: MaxTextConfig, parts: StepParts, state: Any
) -> tuple[PackedBatches, str, HeldOutRows | None]:
    """The run's batches, data fingerprint (for DPO tied to the reference's too) and
    held-out rows, from the run's config, MaxText's step parts and the train ``state``
    the reference starts from."""
    hparams = parts.hparams
    data = PackedDataset(str(config.data_path))
    trained, held = held_out_rows(
        data, eval_split=config.eval_split, eval_data_path=config.eval_data_path
    )
    length = int(hparams.max_target_length)
    if data.seq_len > length:
        raise DataError(
            f"{data.prefix} holds rows of {data.seq_len} inputs, more than the model's "
            f"max_target_length {length}; pass --seq-len {data.seq_len}"
        )
    fingerprint = packed_fingerprint(data)
    if trained is not data:  # the rows trained on are part of the data's identity
        fingerprint = hashlib.sha256(f"{fingerprint}:{trained.num_rows}".encode()).hexdigest()[:16]
    reference = held_reference = None
    if config.objective == "dpo":
        source = config.reference or config.init_from
        weights = reference_fingerprint(source, hparams)
        reference = reference_values(config.reference, parts, state, data, weights)
        held_reference = reference
        if held is not None and held.whole is not data:  # other data: its own, beside it
            held_reference = reference_values(config.reference, parts, state, held, weights)
        fingerprint = hashlib.sha256(f"{fingerprint}:{weights}".encode()).hexdigest()[:16]
    batches = PackedBatches(
        trained,
        batch_size=int(hparams.global_batch_size_to_load),
        seed=config.data_seed,
        length=length,
        reference=reference,
    )
    rows = None if held is None else HeldOutRows(held, config, held_reference)
    return batches, fingerprint, rows
