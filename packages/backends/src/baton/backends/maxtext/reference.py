"""The reference model's log-probabilities of prepared rows, computed by MaxText: its
scorer for an objective that stores them (``ReferenceUse.STORED``), and the facts that
name its weights.

The reference is the run's ``--reference`` or, by default, its starting weights: a
Hugging Face directory (the same architecture and vocabulary as the run's model), a
baton/MaxText checkpoint, or a random initialisation. Its log-probability of every
sequence of the dataset (the sum over the sequence's supervised targets) is computed with
MaxText's model on this run's mesh, a global batch of rows at a time as training packs
them. ``baton.backends.reference_logps`` stores the values beside the data
(``PREFIX.reference-<fingerprint16>.npy`` and its ``.json`` record, one file per
reference for every engine) under the reference's fingerprint
(``reference_model.reference_fingerprint``, the same on every engine), so a changed
reference is another file.

Example::

    fingerprint = reference_fingerprint(config)            # the recipe records it too
    values = compute_reference(parts, state, data, reference_params(parts, state, source))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from baton.backends.maxtext.config import SHAPE_KEYS, MaxTextConfig
from baton.backends.maxtext.objective_loss import model_logits, token_logps
from baton.backends.maxtext.packed_batches import maxtext_batch
from baton.backends.maxtext.step_parts import StepParts
from baton.backends.reference_model import reference_fingerprint as weights_fingerprint
from baton.backends.reference_model import reference_source
from baton.core.errors import UsageError
from baton.core.objectives.array_math import document_sums
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


#: the MaxText settings a random start's weights follow from, besides ``MODEL_KEYS``
START_KEYS = ("model_name", "init_weights_seed", "weight_dtype")


def random_start(config: MaxTextConfig) -> dict[str, Any]:
    """The facts that decide a random initialisation: its seed and the model's settings
    among the run's MaxText overrides (the rest is MaxText's defaults for that model)."""
    overrides = config.overrides
    model = {k: as_text(overrides[k]) for k in (*MODEL_KEYS, *START_KEYS) if k in overrides}
    return {
        "weights": f"random init, seed {overrides.get('init_weights_seed', 0)}",
        "model": model,
        "base_config": config.base_config,
        "engine": "maxtext",
    }


def reference_fingerprint(config: MaxTextConfig) -> str:
    """The fingerprint of the reference of ``config``'s objective: its weights' files
    (``--reference``, else ``--init-from``), or for a random start the facts that decide
    it (``random_start``)."""
    source = reference_source(config.objective, config.init_from)
    return weights_fingerprint(source, fresh=random_start(config))


def check_same_model(source: str, hparams: Any) -> None:
    """``UsageError`` unless the Hugging Face model at ``source`` converts into the run's
    MaxText model: the same MaxText settings of :data:`MODEL_KEYS` (the recipe compared
    the architectures where the run's model has a spec; one built from MaxText settings
    alone is compared here, before its weights are converted)."""
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
    """Every sequence's reference log-probability (float64 ``[num_sequences]``): the sum of
    its supervised targets' log-probabilities (``token_logps``, ``document_sums``), with
    MaxText's model on the run's mesh, a global batch of rows at a time (``params``: the
    reference's weights, ``None``: those of the train ``state``)."""
    import jax
    import jax.numpy as jnp
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
        token, _ = token_logps(logits, batch["targets"])
        supervised = (batch["targets_segmentation"] != 0).astype(jnp.float32)
        return document_sums(jnp, token * supervised, batch["inputs_segmentation"], documents)

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
