"""DPO's reference log-probabilities, computed once by MaxText before training.

The reference is the run's starting weights, a Hugging Face directory (the same
architecture and vocabulary as the run's model) or a baton/MaxText checkpoint. Its
log-probability of every sequence of the dataset (the sum over the sequence's
supervised targets) is computed with MaxText's model on this run's mesh, a global batch
of rows at a time as training packs them. ``baton.backends.reference_logps`` stores the
values beside the data (``PREFIX.reference-<fingerprint16>.npy`` and its ``.json``
record, one file per reference for every engine) under the reference's fingerprint, so
a changed reference is another file.

Example::

    fingerprint = reference_fingerprint(source, parts.hparams)
    values = compute_reference(parts, state, data, reference_params(parts, state, source))
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.maxtext.config import SHAPE_KEYS
from baton.backends.maxtext.dpo import document_logps, target_logps
from baton.backends.maxtext.dpo_loss import model_logits
from baton.backends.maxtext.packed_batches import maxtext_batch
from baton.backends.maxtext.step_parts import StepParts
from baton.backends.reference_logps import model_fingerprint
from baton.core.errors import UsageError
from baton.core.model.spec import is_hf_dir
from baton.data.packed import PackedDataset

#: the MaxText settings that decide a model's log-probabilities
MODEL_KEYS = (
    "decoder_block",
    *SHAPE_KEYS,
    "num_experts",
    "rope_type",
    "rope_max_timescale",
    "normalization_layer_epsilon",
    "logits_via_embedding",
)


def as_text(value: Any) -> str:
    """A setting as comparable text: numbers as floats (``10000`` and ``10000.0`` agree),
    enums by their value."""
    value = getattr(value, "value", value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(float(value))
    return str(value)


def model_settings(hparams: Any) -> dict[str, str]:
    """The settings of :data:`MODEL_KEYS` from MaxText's config, as text."""
    return {key: as_text(getattr(hparams, key)) for key in MODEL_KEYS}


def reference_fingerprint(source: str | None, hparams: Any) -> str:
    """The reference's fingerprint: a Hugging Face directory's as every engine takes it
    (``model_fingerprint``: its weight and config files), so the stored values are one file
    per reference for every engine; a checkpoint's from the xxh3-128 of every file of its
    parameters (as checkpoint manifests record); starting weights drawn at random: the
    initialisation seed and MaxText's model settings."""
    if source and is_hf_dir(source):
        return model_fingerprint(source)
    if source:
        from baton.backends.maxtext.checkpoint import params_path
        from baton.core.checkpoints.files import manifest

        files = json.dumps(manifest(params_path(source)), sort_keys=True)
        return hashlib.sha256(files.encode()).hexdigest()
    facts = {
        "weights": f"random init, seed {getattr(hparams, 'init_weights_seed', 0)}",
        "model": model_settings(hparams),
        "engine": "maxtext",
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def check_same_model(source: str, hparams: Any) -> None:
    """``UsageError`` unless the Hugging Face model at ``source`` has the run's architecture
    and vocabulary."""
    from baton.backends.maxtext.hf import maxtext_settings
    from baton.core.model.spec import LlamaSpec

    wanted = maxtext_settings(LlamaSpec.from_hf(source))
    have = model_settings(hparams)
    differ = [
        f"{key} {wanted[key]} (the run: {have[key]})"
        for key in MODEL_KEYS
        if key in wanted and as_text(wanted[key]) != have[key]
    ]
    if differ:
        raise UsageError(
            f"reference model {source} differs from the model trained: {'; '.join(differ)}; "
            "pass a reference of the same architecture and tokenizer"
        )


def reference_params(parts: StepParts, state: Any, source: str | None) -> Any:
    """The reference's parameters as a pure dict on the shardings of the run's train
    ``state`` (``None``: the run's own starting weights)."""
    import jax
    from flax import nnx

    if source is None:
        return None
    current = nnx.state(nnx.merge(parts.graphdef, state).model, nnx.Param)
    if (Path(source) / "config.json").is_file():
        from baton.backends.hf_io import read_safetensors
        from baton.backends.maxtext.hf import hf_to_maxtext
        from baton.core.model.spec import LlamaSpec

        check_same_model(source, parts.hparams)
        weights = hf_to_maxtext(
            read_safetensors(source, framework="numpy"), LlamaSpec.from_hf(source)
        )
        return jax.tree.map(
            lambda have, new: jax.device_put(np.asarray(new, dtype=have.dtype), have.sharding),
            current.to_pure_dict(),
            weights["params"],
        )
    from maxtext.common import checkpointing

    from baton.backends.maxtext.checkpoint import params_path

    cfg = parts.hparams
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), current
    )
    restored = checkpointing.load_params_from_path(
        str(params_path(source)),
        abstract,
        cfg.checkpoint_storage_concurrent_gb,
        cfg.checkpoint_storage_use_ocdbt,
        cfg.checkpoint_storage_use_zarr3,
    )
    return restored.to_pure_dict() if isinstance(restored, nnx.State) else restored


def compute_reference(parts: StepParts, state: Any, data: PackedDataset, params: Any) -> np.ndarray:
    """Every sequence's reference log-probability (float64 ``[num_sequences]``), with
    MaxText's model on the run's mesh, a global batch of rows at a time (``params``: the
    reference's weights, ``None``: those of the train ``state``)."""
    import jax
    from flax import nnx
    from flax.core.spmd import logical_axis_rules
    from jax.experimental import multihost_utils
    from maxtext.utils import sharding

    cfg, graphdef, mesh = parts.hparams, parts.graphdef, parts.mesh
    documents = data.max_documents_per_row

    def logps_of(state: Any, params: Any, batch: dict[str, Any]) -> Any:
        model = nnx.merge(graphdef, state).model
        if params is not None:
            weights = nnx.state(model, nnx.Param)
            nnx.replace_by_pure_dict(weights, params)
            nnx.update(model, weights)
        logits = model_logits(model, cfg, batch, is_train=False)
        token = target_logps(logits, batch["targets"])
        return document_logps(token, batch["targets_segmentation"], documents)[0]

    run = jax.jit(logps_of)
    placement = sharding.get_input_data_sharding(cfg, mesh)
    size, length = int(cfg.global_batch_size_to_load), int(cfg.max_target_length)
    values = np.zeros(data.num_sequences, dtype=np.float64)
    for start in range(0, data.num_rows, size):
        rows = list(range(start, min(start + size, data.num_rows)))
        padded = rows + [rows[0]] * (size - len(rows))
        packed = data.batch(padded)
        batch = jax.device_put(maxtext_batch(packed, length=length), placement)
        with jax.set_mesh(mesh), logical_axis_rules(cfg.logical_axis_rules):
            out = np.asarray(
                multihost_utils.process_allgather(run(state, params, batch), tiled=True)
            )
        for b in range(len(rows)):
            present = packed.documents[b] >= 0
            values[packed.documents[b][present]] = out[b][present]
    return values
