"""MaxText's model on one batch of token ids, outside the train step: its logits, and the
loss MaxText's own ``eval_step`` (``train.loss_fn``) computes; and other weights into a
set-up model through MaxText's ``load_params_from_path`` (what ``load_parameters_path``
runs at setup). For parity checks between backends: after ``setup`` (which loaded
``--init-from``), the model computes the same function as the Hugging Face model it
came from.

Example::

    backend.setup()
    scores = logits(backend, tokens)              # [batch, seq, vocab] float32 numpy
    value = loss(backend, tokens, targets)        # mean next-token cross entropy
    load_params(backend, hf.write_params("other-llama/", "runs/x/other"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def token_batch(tokens: Any, targets: Any | None = None) -> dict[str, np.ndarray]:
    """MaxText's batch dict for ``[batch, seq]`` token ids: positions from 0, one
    segment per row, every target counted (``targets`` default to ``tokens``)."""
    inputs = np.asarray(tokens, dtype=np.int32)
    positions = np.broadcast_to(np.arange(inputs.shape[1], dtype=np.int32), inputs.shape)
    segments = np.ones_like(inputs)
    labels = inputs if targets is None else np.asarray(targets, dtype=np.int32)
    return {
        "inputs": inputs,
        "targets": labels,
        "inputs_position": np.array(positions),
        "targets_position": np.array(positions),
        "inputs_segmentation": segments,
        "targets_segmentation": segments.copy(),
    }


def logits(backend: Any, tokens: Any) -> np.ndarray:
    """The logits of a set-up ``MaxTextBackend``'s model on ``[batch, seq]`` token ids."""
    import jax
    from flax import nnx
    from flax.core.spmd import logical_axis_rules

    batch = token_batch(tokens)
    with jax.set_mesh(backend.mesh), logical_axis_rules(backend.hparams.logical_axis_rules):
        model = nnx.merge(backend.graphdef, backend.state).model
        out = model(
            decoder_input_tokens=batch["inputs"],
            decoder_positions=batch["inputs_position"],
            decoder_segment_ids=batch["inputs_segmentation"],
            enable_dropout=False,
        )
    return np.array(jax.device_get(out), dtype=np.float32)  # a writable copy


def loss(backend: Any, tokens: Any, targets: Any) -> float:
    """Mean cross entropy of ``targets`` given ``tokens``, by MaxText's ``eval_step``."""
    return losses(backend, tokens, targets)[0]


def losses(backend: Any, tokens: Any, targets: Any) -> tuple[float, float]:
    """MaxText's ``eval_step`` on one batch: the mean cross entropy and the
    load-balancing loss it adds to it (``moe_lb_loss``; 0.0 without experts)."""
    import jax
    from flax.core.spmd import logical_axis_rules
    from maxtext.trainers.pre_train import train

    cfg = backend.hparams
    batch = token_batch(tokens, targets)
    with jax.set_mesh(backend.mesh), logical_axis_rules(cfg.logical_axis_rules):
        scalars = train.eval_step(backend.graphdef, cfg, backend.state, batch)["scalar"]
    total, weights, balance = jax.device_get((
        scalars["evaluation/total_loss"], scalars["evaluation/total_weights"],
        scalars["evaluation/moe_lb_loss"],
    ))  # fmt: skip
    return float(total) / float(weights), float(balance)


def load_params(backend: Any, items: str | Path) -> None:
    """Replace a set-up ``MaxTextBackend``'s model weights with a MaxText parameter
    checkpoint (``load_parameters_path``'s form, e.g. ``hf.write_params``' result), read
    by MaxText's ``checkpointing.load_params_from_path`` onto the model's own arrays."""
    from flax import nnx
    from maxtext.common import checkpointing

    cfg = backend.hparams
    model = backend.state["model"]
    restored = checkpointing.load_params_from_path(
        str(items),
        model.filter(nnx.Param),
        cfg.checkpoint_storage_concurrent_gb,
        use_ocdbt=cfg.checkpoint_storage_use_ocdbt,
        use_zarr3=cfg.checkpoint_storage_use_zarr3,
    )
    pure = restored.to_pure_dict() if isinstance(restored, nnx.State) else restored
    nnx.replace_by_pure_dict(model, pure)


def maxtext_aux_loss(router_logits: Any, *, top_k: int, coef: float, sequences: int) -> float:
    """MaxText's load-balancing loss from ``transformers``' router logits (one
    ``[tokens, experts]`` tensor a layer, ``sequences`` sequences of equal length):
    Switch Transformer's per sequence, token fractions over top-k, averaged over the
    sequences and the layers, weight ``coef * top_k`` (what baton sets)."""
    import torch

    per_layer = []
    for logits in router_logits:
        experts = logits.shape[-1]
        probs = torch.softmax(logits.float(), -1).view(sequences, -1, experts)
        chosen = torch.topk(logits, top_k, dim=-1).indices.view(sequences, -1, top_k)
        density = torch.nn.functional.one_hot(chosen, experts).sum(2).float().mean(1) / top_k
        loss = (density * probs.mean(1)).mean() * experts**2 * coef * top_k
        per_layer.append(loss)
    return float(torch.stack(per_layer).mean())
