"""The shared torch post-training objectives on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from baton.backends import torch_objectives as objectives


def test_token_logps_are_log_softmax_at_the_target() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 4, 0], [2, 2, 3]])
    expected = torch.log_softmax(logits, -1).gather(2, targets[..., None])[..., 0]
    torch.testing.assert_close(objectives.token_logps(logits, targets), expected)


def test_sft_loss_sum_counts_only_supervised_targets() -> None:
    logits = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[False, True, True, False]])
    logps = torch.log_softmax(logits, -1)[0, [1, 2], [2, 3]]
    torch.testing.assert_close(objectives.sft_loss_sum(logits, targets, mask), -logps.sum())


def test_document_sums_and_pairs_follow_segments() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 0.0], [6.0, 7.0, 8.0, 0.0, 0.0, 0.0]])
    segments = torch.tensor([[1, 1, 2, 3, 4, 0], [1, 2, 2, 0, 0, 0]])
    sums = objectives.segment_sums(values, segments, 4)
    assert sums.tolist() == [[3.0, 3.0, 4.0, 5.0], [6.0, 15.0, 0.0, 0.0]]
    documents = torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1]])
    chosen, rejected = objectives.split_pairs(sums, documents)
    assert chosen.tolist() == [3.0, 4.0, 6.0] and rejected.tolist() == [3.0, 5.0, 15.0]


def test_dpo_losses_follow_trl() -> None:
    pi_c, pi_r = torch.tensor([-10.0, -20.0]), torch.tensor([-12.0, -18.0])
    ref_c, ref_r = torch.tensor([-11.0, -19.0]), torch.tensor([-11.0, -19.0])
    sigmoid = objectives.dpo_losses(pi_c, pi_r, ref_c, ref_r, beta=0.5)
    expected = -torch.nn.functional.logsigmoid(0.5 * torch.tensor([2.0, -2.0]))
    torch.testing.assert_close(sigmoid, expected)
    equal = objectives.dpo_losses(pi_c, pi_r, pi_c, pi_r, beta=0.5)
    assert equal.tolist() == pytest.approx([math.log(2)] * 2)
    n_c, n_r = torch.tensor([2.0, 4.0]), torch.tensor([1.0, 2.0])
    ipo = objectives.dpo_losses(
        pi_c, pi_r, ref_c, ref_r, beta=0.5, loss_type="ipo", chosen_tokens=n_c, rejected_tokens=n_r
    )
    delta = torch.tensor([1.0 / 2 - (-1.0) / 1, -1.0 / 4 - 1.0 / 2])
    torch.testing.assert_close(ipo, (delta - 1.0) ** 2)
    with pytest.raises(ValueError, match="ipo loss needs"):
        objectives.dpo_losses(pi_c, pi_r, ref_c, ref_r, beta=0.5, loss_type="ipo")
    with pytest.raises(ValueError, match="use one of sigmoid, ipo"):
        objectives.dpo_losses(pi_c, pi_r, ref_c, ref_r, beta=0.5, loss_type="hinge")


def test_dpo_metric_sums_are_trl_metrics_times_pairs() -> None:
    pi_c, pi_r = torch.tensor([-10.0, -20.0]), torch.tensor([-12.0, -18.0])
    ref = torch.tensor([-11.0, -19.0])
    sums = objectives.dpo_metric_sums(pi_c, pi_r, ref, ref, beta=0.5)
    assert set(sums) == set(objectives.DPO_METRICS)
    assert sums["rewards/chosen"].item() == pytest.approx(0.5 * (1 - 1))
    assert sums["rewards/rejected"].item() == pytest.approx(0.5 * (-1 + 1))
    assert sums["rewards/margins"].item() == pytest.approx(0.5 * (2 - 2))
    assert sums["rewards/accuracies"].item() == 1.0
    assert sums["logps/chosen"].item() == -30.0 and sums["logps/rejected"].item() == -30.0
