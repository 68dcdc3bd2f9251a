"""DPO's math in JAX, once: per-document log-probabilities, the sigmoid and IPO losses,
and TRL's metrics, with TRL's ``DPOTrainer`` conventions.

A document's log-probability is the sum of ``log p(target)`` over its supervised targets.
For each pair (chosen ``c``, rejected ``r``, the policy ``pi`` and the reference ``ref``):

- ``sigmoid``: ``-log_sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))``;
- ``ipo``: ``((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 * beta)) ** 2``, the
  log-ratios averaged over each completion's ``n`` supervised tokens (TRL's IPO).

The step's loss is the mean over the pairs of the global batch. Everything here returns
sums over pairs (and the pair count), so micro-batches and ranks add up before dividing.

Metrics (TRL's names and meanings, means over the pairs): ``rewards/chosen`` (``beta *
(pi_c - ref_c)``), ``rewards/rejected``, ``rewards/margins`` (chosen minus rejected),
``rewards/accuracies`` (the fraction with chosen > rejected), ``logps/chosen``,
``logps/rejected``.

Example::

    token = target_logps(logits, batch["targets"])                       # [B, L]
    logps, counts = document_logps(token, batch["targets_segmentation"], 4)  # [B, 4] each
    sums = pair_sums(logps, counts, batch["reference_logps"], beta=0.1, loss_type="sigmoid")
    loss = sums["loss"] / sums["pairs"]
    metrics = pair_metrics(sums)                                          # {"rewards/chosen": ...}
"""

from __future__ import annotations

from typing import Any

#: TRL's DPO metric names, in the order :func:`pair_sums` sums them
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def target_logps(logits: Any, targets: Any) -> Any:
    """``log p(target)`` of each position (float32) from ``[B, L, V]`` logits."""
    import jax
    import jax.numpy as jnp

    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]


def document_logps(token_logps: Any, segmentation: Any, num_documents: int) -> tuple[Any, Any]:
    """Per document ``d`` of each row (segment ``d + 1``): the sum of ``token_logps`` over
    its supervised targets and their count, each ``[B, num_documents]``. ``segmentation``
    is the document of each supervised target, 0 elsewhere (MaxText's
    ``targets_segmentation``). Elementwise (no matmul, so no reduced-precision dot)."""
    import jax.numpy as jnp

    documents = jnp.arange(1, num_documents + 1, dtype=segmentation.dtype)
    member = (segmentation[..., None] == documents).astype(jnp.float32)  # [B, L, D]
    return (token_logps[..., None] * member).sum(axis=1), member.sum(axis=1)


def pair_losses(
    chosen_ratio: Any, rejected_ratio: Any, counts: tuple[Any, Any], beta: float, loss_type: str
) -> Any:
    """Each pair's loss from the policy-minus-reference log-ratios and the completions'
    supervised token counts."""
    import jax
    import jax.numpy as jnp

    if loss_type == "sigmoid":
        return -jax.nn.log_sigmoid(beta * (chosen_ratio - rejected_ratio))
    if loss_type == "ipo":
        chosen_count, rejected_count = (jnp.maximum(c, 1.0) for c in counts)
        delta = chosen_ratio / chosen_count - rejected_ratio / rejected_count
        return (delta - 1 / (2 * beta)) ** 2
    raise ValueError(f"DPO loss {loss_type!r}: use sigmoid or ipo")


def pair_sums(
    logps: Any, counts: Any, reference: Any, *, beta: float, loss_type: str
) -> dict[str, Any]:
    """Sums over the pairs of a batch: ``loss``, ``pairs`` (int32) and ``metrics`` (a
    vector in the order of :data:`METRICS`). Documents ``2k`` and ``2k + 1`` of a row are
    pair ``k`` (chosen, rejected); a pair is counted where both have supervised tokens."""
    import jax.numpy as jnp

    policy_c, policy_r = logps[:, 0::2], logps[:, 1::2]
    ref_c, ref_r = reference[:, 0::2].astype(jnp.float32), reference[:, 1::2].astype(jnp.float32)
    count_c, count_r = counts[:, 0::2], counts[:, 1::2]
    valid = (count_c > 0) & (count_r > 0)
    weight = valid.astype(jnp.float32)
    chosen_ratio, rejected_ratio = policy_c - ref_c, policy_r - ref_r
    losses = pair_losses(chosen_ratio, rejected_ratio, (count_c, count_r), beta, loss_type)
    reward_c, reward_r = beta * chosen_ratio, beta * rejected_ratio
    per_pair = (
        reward_c,
        reward_r,
        reward_c - reward_r,
        (reward_c > reward_r).astype(jnp.float32),
        policy_c,
        policy_r,
    )
    return {
        "loss": jnp.sum(jnp.where(valid, losses, 0.0)),
        "pairs": jnp.sum(valid.astype(jnp.int32)),
        "metrics": jnp.stack([jnp.sum(value * weight) for value in per_pair]),
    }


def pair_metrics(metric_sums: Any, pairs: Any) -> dict[str, Any]:
    """TRL's metrics (means over the pairs) from :func:`pair_sums`' ``metrics`` and count."""
    import jax.numpy as jnp

    count = jnp.maximum(pairs, 1).astype(jnp.float32)
    return {name: metric_sums[i] / count for i, name in enumerate(METRICS)}
