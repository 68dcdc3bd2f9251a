"""Per-token log-probabilities and entropies from Megatron's vocab-parallel logits: each
tensor-parallel rank holds ``logits[..., V / tp]``, its shard of the vocabulary (the
output layer's columns), and the softmax needs the whole row, so the reductions over the
vocabulary run over the tensor-parallel group.

The log-probabilities go through Megatron's own ``vocab_parallel_cross_entropy`` (its
forward and backward) on ``logits / temperature`` in float32; the entropy, which no
gradient flows through, is a max, then one summed pair ``(sum exp, sum exp * logit)``
over the group. With one tensor-parallel rank both are the full-vocabulary quantities.

Example::

    logits = model(tokens, position_ids, mask)              # [b, s, V / tp], labels=None
    logps = token_logps(logits, labels, temperature=0.7)    # [b, s] float32, differentiable
    entropy = token_entropy(logits, temperature=0.7)        # [b, s] float32, no gradient
"""

from __future__ import annotations

import torch


def token_logps(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log p(labels[b, t])`` under ``logits[b, t] / temperature`` (float32, ``[b, s]``):
    minus Megatron's vocab-parallel cross entropy. ``labels`` are any ids of the (padded)
    vocabulary; the loss mask decides which count."""
    from megatron.core import tensor_parallel

    # a new tensor even at temperature 1: Megatron's cross entropy shifts its input in place
    scaled = logits.float() / temperature
    return -tensor_parallel.vocab_parallel_cross_entropy(scaled, labels)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The entropy of each predicted distribution ``softmax(logits[b, t] / temperature)``
    over the whole vocabulary (float32, ``[b, s]``, without gradient):
    ``log Z - sum(exp(z) * z) / Z`` with ``z`` the logits less their maximum."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    shared = parallel_state.get_tensor_model_parallel_world_size() > 1
    scaled = logits.float() / temperature
    top = scaled.max(dim=-1).values
    if shared:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = scaled - top.unsqueeze(-1)
    exp = shifted.exp()
    sums = torch.stack([exp.sum(dim=-1), (exp * shifted).sum(dim=-1)])
    if shared:
        dist.all_reduce(sums, group=group)
    total, weighted = sums
    return total.log() - weighted / total
