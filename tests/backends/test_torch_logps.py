"""What every torch engine hands an objective's loss (``torch_logps``), on hand-made
tensors: log-probabilities and entropy at a temperature, and metrics as one
``(sum, weight)`` tensor."""

from __future__ import annotations

import pytest
import torch

from baton.backends.torch_logps import metric_means, metric_sums, token_entropy, token_logps
from baton.core.objectives import LossTerms


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logps_are_the_log_softmax_at_the_target(temperature):
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 4, 0], [2, 2, -100]])
    full = torch.log_softmax(logits / temperature, -1)
    expected = full.gather(2, targets.clamp(min=0)[..., None])[..., 0]
    expected[1, 2] = 0.0  # no target there
    torch.testing.assert_close(token_logps(logits, targets, temperature), expected)
    entropy = -(full.exp() * full).sum(-1)
    torch.testing.assert_close(token_entropy(logits, temperature), entropy)
    assert not token_entropy(logits.requires_grad_(), temperature).requires_grad


def test_metrics_travel_as_sums_and_weights():
    terms = LossTerms(
        total=torch.tensor(1.0),
        metrics={"kl": (torch.tensor(3.0), torch.tensor(6.0)), "entropy": (2.0, 4.0)},
    )
    names = ("entropy", "kl")
    sums = metric_sums(terms, names, like=torch.zeros(()))
    assert sums.tolist() == [[2.0, 3.0], [4.0, 6.0]]
    twice = sums + metric_sums(terms, names, like=torch.zeros(()))  # two micro-batches
    assert {k: float(v) for k, v in metric_means(twice, names).items()} == {
        "entropy": 0.5,
        "kl": 0.5,
    }
