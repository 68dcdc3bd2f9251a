"""The data stream of a MaxText run on prepared rows (an objective that does not read
text): its rows as MaxText batches and, for an objective computed by baton's loss
(``objective_loss``), each row's documents and the objective's document values; for an
objective with a stored reference (``ReferenceUse.STORED``) the reference's
log-probabilities, read from beside the data or computed once here, before the first
step.

Every row trains unless rows are held out for evaluation (``config.eval_split``: the
last rows; ``config.eval_data_path``: other prepared data, whose stored reference is
kept beside it); ``HeldOutRows`` evaluates them with MaxText's model as the objective's
declared loss over all of them (``baton.backends.posttrain_evaluation``).

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

import numpy as np

from baton.backends.maxtext.config import MaxTextConfig
from baton.backends.maxtext.objective_loss import batch_rows, model_logits, token_logps
from baton.backends.maxtext.packed_batches import PackedBatches, maxtext_batch
from baton.backends.maxtext.reference import (
    compute_reference,
    reference_fingerprint,
    reference_params,
)
from baton.backends.maxtext.step_parts import StepParts
from baton.backends.posttrain_evaluation import (
    evaluation_means,
    evaluation_sums,
    held_out_batch,
    row_batches,
)
from baton.backends.reference_logps import stored_or_computed
from baton.core.objectives import LossInputs, ObjectiveRun, ReferenceUse
from baton.data import DataError
from baton.data.packed import PackedDataset, held_out_rows, mask_path

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


@dataclass(frozen=True)
class HeldOutRows:
    """A run's held-out rows, the values their objective reads per document (a stored
    reference's log-probabilities), and their evaluation."""

    run: ObjectiveRun
    data: PackedDataset
    values: dict[str, np.ndarray]

    def evaluate(self, parts: StepParts, state: Any) -> dict[str, float]:
        """The objective's declared loss (and its metrics) over every held-out row, with
        the train ``state``'s weights: MaxText's model on the run's mesh, a global batch
        of rows at a time (the last filled with stand-in rows that add nothing), the
        loss's inputs as training computes them (``objective_loss``), the sums added
        over the batches (``posttrain_evaluation``)."""
        import array_api_compat
        import jax
        import jax.numpy as jnp
        from flax import nnx
        from flax.core.spmd import logical_axis_rules
        from jax.sharding import NamedSharding, PartitionSpec
        from maxtext.utils import sharding

        cfg, graphdef, mesh, run = parts.hparams, parts.graphdef, parts.mesh, self.run

        def sums_of(state: Any, batch: dict[str, Any]) -> Any:
            logits = model_logits(nnx.merge(graphdef, state).model, cfg, batch, is_train=False)
            rows = batch_rows(run, batch)
            logps, entropy = token_logps(
                logits, batch["targets"], run.temperature, entropy=run.objective.entropy
            )
            logps = jnp.where(rows.segments != 0, logps, 0.0)  # nothing predicted on padding
            xp = array_api_compat.array_namespace(logps)
            return evaluation_sums(xp, run, LossInputs(rows, logps, entropy))

        scored = jax.jit(sums_of, out_shardings=NamedSharding(mesh, PartitionSpec()))
        placement = sharding.get_input_data_sharding(cfg, mesh)
        size, length = int(cfg.global_batch_size_to_load), int(cfg.max_target_length)
        total = np.zeros(2 + 2 * len(run.objective.metrics), dtype=np.float64)
        for rows in row_batches(self.data.num_rows, size):
            packed = maxtext_batch(
                held_out_batch(self.data, rows), length=length, documents=True,
                document_values=self.values,
            )  # fmt: skip
            batch = jax.device_put(packed, placement)
            with jax.set_mesh(mesh), logical_axis_rules(cfg.logical_axis_rules):
                sums = scored(state, batch)
            total += np.asarray(sums.addressable_shards[0].data, dtype=np.float64)
        return evaluation_means(run, total)


def post_training_stream(
    config: MaxTextConfig, parts: StepParts, state: Any
) -> tuple[PackedBatches, str, HeldOutRows | None]:
    """The run's batches, data fingerprint (with a stored reference, tied to the
    reference's too) and held-out rows, from the run's config, MaxText's step parts and
    the train ``state``
    the reference starts from."""
    hparams = parts.hparams
    run = config.objective
    data = PackedDataset(str(config.data_path))
    trained, held = held_out_rows(
        data, run.name, eval_split=config.eval_split, eval_data_path=config.eval_data_path
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
    values: dict[str, np.ndarray] = {}
    held_values: dict[str, np.ndarray] = {}
    if run.reference_use is ReferenceUse.STORED:
        if STORED_REFERENCE not in run.objective.document_values:
            raise ValueError(
                f"objective {run.name} stores its reference's log-probabilities but does not "
                f"declare the document value {STORED_REFERENCE!r} they fill"
            )
        weights = reference_fingerprint(config)
        values[STORED_REFERENCE] = reference_values(run, parts, state, data, weights)
        held_values = values
        if held is not None and held.whole is not data:  # other data: its own, beside it
            held_values = {STORED_REFERENCE: reference_values(run, parts, state, held, weights)}
        fingerprint = hashlib.sha256(f"{fingerprint}:{weights}".encode()).hexdigest()[:16]
    batches = PackedBatches(
        trained,
        batch_size=int(hparams.global_batch_size_to_load),
        seed=config.data_seed,
        length=length,
        documents=not run.objective.native_cross_entropy,
        document_values=values,
    )
    rows = None if held is None else HeldOutRows(run, held, held_values)
    return batches, fingerprint, rows
