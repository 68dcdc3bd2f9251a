"""What TorchTitan hands an objective's loss: the log-probability of each label at the
objective's temperature (and the entropy where the objective reads it), through
TorchTitan's own ``compute_logprobs`` (which gathers tensor-parallel vocabulary shards),
and the array namespace the losses compute with on torch tensors.

Example::

    logps, entropy = token_logps(logits, labels, run.temperature, entropy=run.objective.entropy)
    terms = run.loss(TORCH, LossInputs(rows, logps, entropy))
"""

from __future__ import annotations

import array_api_compat
import torch
from torchtitan.components.loss import compute_logprobs

#: the array namespace of torch tensors (what the objectives' losses compute with)
TORCH = array_api_compat.array_namespace(torch.zeros(()))


def token_logps(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logps, entropy)``, each ``[B, T]`` float32: the log-probability of each label
    under ``logits / temperature`` (0 at the ignore index) and, with ``entropy``, each
    predicted distribution's entropy (no gradient; else None), through TorchTitan's
    ``compute_logprobs`` (tensor-parallel logits gathered)."""
    if temperature != 1.0:
        logits = logits.float() / temperature
    if entropy:
        logps, entropies = compute_logprobs(logits, labels, return_entropy=True)
        return logps, entropies
    logps = compute_logprobs(logits, labels)
    assert isinstance(logps, torch.Tensor)
    return logps, None
