"""The post-training references every engine's tests compare against are right: the SFT
reference equals a hand computation, TRL's DPO loss is ln 2 at equal weights and equals
the DPO formulas (sigmoid, and IPO with TRL's per-token average) on hand-computed
log-probabilities."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from support.posttrain import (
    chat_tokenizer,
    conversations,
    dpo_reference,
    dpo_reference_pairs,
    pairs_of_documents,
    preference_documents,
    preference_pairs,
    preference_prefix,
    sft_document,
    sft_prefix,
    sft_reference,
    sft_reference_documents,
    tiny_model,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, object]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("posttrain")
    tok = chat_tokenizer(root / "tok")
    return (
        tok,
        tiny_model(root / "policy"),
        tiny_model(root / "ref", seed=1),
        AutoTokenizer.from_pretrained(tok),
    )


def _model(directory: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)


def _target_logps(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """log p(token t | tokens before t) for t = 1..n-1, by hand."""
    ids = torch.tensor([tokens])
    logits = model(input_ids=ids).logits[0, :-1]
    return torch.log_softmax(logits.double(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]


def test_sft_reference_equals_a_hand_computation(setup) -> None:
    _, policy, _, tokenizer = setup
    tokens, mask = sft_document(tokenizer, conversations(1, seed=3)[0])
    assert mask[0] == 0 and 0 < sum(mask) < len(mask)
    loss, grad_norm = sft_reference_documents(policy, [(tokens, mask)])

    model = _model(policy)
    picked = torch.tensor(mask[1:], dtype=torch.bool)
    hand = -_target_logps(model, tokens)[picked].mean()
    hand.backward()
    hand_norm = torch.cat([p.grad.double().flatten() for p in model.parameters()]).norm()
    assert loss == pytest.approx(float(hand), rel=1e-6)
    assert grad_norm == pytest.approx(float(hand_norm), rel=1e-5)


def test_sft_reference_averages_over_all_supervised_tokens(setup) -> None:
    _, policy, _, tokenizer = setup
    documents = [sft_document(tokenizer, m) for m in conversations(2, seed=4)]
    loss, _ = sft_reference_documents(policy, documents)
    model = _model(policy)
    sums = [
        -_target_logps(model, t)[torch.tensor(m[1:], dtype=torch.bool)].sum() for t, m in documents
    ]
    count = sum(sum(m) for _, m in documents)
    assert loss == pytest.approx(float(sum(sums)) / count, rel=1e-6)


def test_dpo_reference_is_ln2_at_equal_weights(setup) -> None:
    tok, policy, _, _ = setup
    result = dpo_reference_pairs(policy, policy, tok, preference_pairs(3), 0.1, "sigmoid")
    assert result["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert result["rewards/margins"] == 0.0


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_reference_equals_the_formulas(setup, loss_type: str) -> None:
    tok, policy, ref, tokenizer = setup
    pairs = preference_pairs(3, seed=1)
    documents = [d for pair in pairs for d in preference_documents(tokenizer, pair)]
    beta = 0.2
    result = dpo_reference_pairs(
        policy, ref, tok, pairs, beta, loss_type, expected_ids=pairs_of_documents(documents)
    )

    def sums(directory: Path) -> torch.Tensor:
        model = _model(directory)
        with torch.no_grad():
            return torch.stack(
                [
                    _target_logps(model, t)[torch.tensor(m[1:], dtype=torch.bool)].sum()
                    for t, m in documents
                ]
            )

    pi, ref_logps = sums(policy), sums(ref)
    counts = torch.tensor([sum(m) for _, m in documents], dtype=torch.float64)
    chosen, rejected = (pi - ref_logps)[0::2], (pi - ref_logps)[1::2]
    if loss_type == "sigmoid":
        losses = -torch.nn.functional.logsigmoid(beta * (chosen - rejected))
    else:  # TRL's IPO: log-ratios averaged over each completion's tokens
        delta = chosen / counts[0::2] - rejected / counts[1::2]
        losses = (delta - 1 / (2 * beta)) ** 2
    assert result["loss"] == pytest.approx(float(losses.mean()), rel=1e-5)
    # rewards are differences of fp32 sums of ~50: compared to an absolute tolerance
    reward = beta * 1e-5 * float(pi.abs().max())
    assert result["rewards/chosen"] == pytest.approx(float(beta * chosen.mean()), abs=reward)
    assert result["rewards/rejected"] == pytest.approx(float(beta * rejected.mean()), abs=reward)
    margins = beta * (chosen - rejected)
    assert result["rewards/margins"] == pytest.approx(float(margins.mean()), abs=reward)
    assert result["rewards/accuracies"] == pytest.approx(float((margins > 0).double().mean()))
    assert result["logps/chosen"] == pytest.approx(float(pi[0::2].mean()), rel=1e-5)
    assert result["logps/rejected"] == pytest.approx(float(pi[1::2].mean()), rel=1e-5)


def test_prefixes_hold_packed_conversations_and_trl_pairs(setup, tmp_path: Path) -> None:
    from baton.data.packed import PackedDataset

    tok, policy, _, _ = setup
    sft = PackedDataset(sft_prefix(tmp_path, tok, seq_len=96, num_rows=4))
    assert sft.objective == "sft" and sft.num_rows == 4
    assert all(2 <= len(sft.row(r)) <= 4 for r in range(4))
    pairs = preference_prefix(tmp_path, tok, seq_len=96, num_rows=3)
    assert PackedDataset(pairs).objective == "preference"
    # dpo_reference checks that TRL tokenized the pairs into the dataset's documents
    result = dpo_reference(policy, policy, pairs, rows=[0, 2], beta=0.1, loss_type="sigmoid")
    assert result["loss"] == pytest.approx(math.log(2), rel=1e-6)
    loss, grad_norm = sft_reference(policy, sft.prefix, rows=[1])
    assert loss > 0 and grad_norm > 0
