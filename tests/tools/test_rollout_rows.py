"""Rollout rows: the packed-data conventions (checked against PackedDataset.batch on the
same tokens), the sampling log-probabilities under the completion targets, truncated
completions masked, data-parallel shares and micro-batches, the exact state round trip,
and the seeded, resumable prompt order."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from baton.data import DataError, TokenizerInfo
from baton.data.packed import PackedDataset, write_packed
from baton.data.prompt_order import PromptOrder
from baton.data.rollouts import Rollout, RolloutBatch

SEQ_LEN = 10
#: (prompt ids, completion ids, truncated)
ROLLOUTS = [
    ([3, 4, 5], [6, 7, 0], False),
    ([3, 4, 5], [8, 9, 10, 11, 12, 13, 14, 15], True),  # fills seq_len + 1 = 11 tokens
    ([20, 21], [22, 0], False),
    ([20, 21], [23, 24, 25], True),
]


def records(step: int = 1) -> tuple[list[Rollout], list[list[float]]]:
    rng = np.random.default_rng(0)
    made, logps = [], []
    for i, (prompt, completion, truncated) in enumerate(ROLLOUTS):
        values = (-rng.random(len(completion))).astype(np.float32).tolist()
        made.append(
            Rollout(
                step=step,
                index=i,
                prompt_index=i // 2,
                prompt_ids=prompt,
                completion_ids=completion,
                completion=f"text {i}",
                rewards={"accuracy": float(i % 2), "format": None if i == 3 else 0.5},
                reward=math.nan if i == 2 else float(i),
                advantage=float(np.float32(0.25 * i - 0.3)),
                logp_sum=float(sum(values)),
                truncated=truncated,
            )
        )
        logps.append(values)
    return made, logps


def test_rows_follow_the_packed_data_conventions(tmp_path: Path, tokenizer: TokenizerInfo) -> None:
    made, logps = records()
    batch = RolloutBatch.build(made, logps, seq_len=SEQ_LEN, pad_id=1)
    # the same rollouts as prepared SFT data: one document per row, the completion supervised
    rows = [[([*p, *c], [0] * len(p) + [1] * len(c))] for p, c, _ in ROLLOUTS]
    prefix = tmp_path / "same"
    write_packed(prefix, rows, objective="sft", seq_len=SEQ_LEN, tokenizer=tokenizer, mask="given")
    packed = PackedDataset(prefix).batch(range(len(ROLLOUTS)), pad_id=1)
    for name in ("inputs", "targets", "loss_mask", "positions", "segments", "documents"):
        np.testing.assert_array_equal(getattr(batch.rows, name), getattr(packed, name), name)
    assert batch.rows.documents.tolist() == [[0], [1], [2], [3]]  # the rollout's index
    np.testing.assert_array_equal(batch.completion_mask, batch.rows.loss_mask)

    old = batch.values["old_logps"]
    assert old.shape == (4, SEQ_LEN) and old.dtype == np.float32
    for b, (prompt, completion, _) in enumerate(ROLLOUTS):
        first = len(prompt) - 1
        # old_logps[t] is the log-probability of targets[t]: the completion's tokens in order
        assert batch.rows.targets[b, first : first + len(completion)].tolist() == completion
        assert old[b, first : first + len(completion)].tolist() == logps[b]
        assert (old[b][~batch.completion_mask[b]] == 0).all()
    assert batch.values["advantages"].tolist() == [[r.advantage] for r in made]
    assert batch.supervised_tokens == sum(len(c) for _, c, _ in ROLLOUTS)


def test_truncated_completions_are_masked_on_request() -> None:
    made, logps = records()
    masked = RolloutBatch.build(
        made, logps, seq_len=SEQ_LEN, pad_id=0, mask_truncated_completions=True
    )
    kept = RolloutBatch.build(made, logps, seq_len=SEQ_LEN, pad_id=0)
    truncated = np.array([t for _, _, t in ROLLOUTS])
    assert not masked.rows.loss_mask[truncated].any()
    np.testing.assert_array_equal(
        masked.rows.loss_mask[~truncated], kept.rows.loss_mask[~truncated]
    )
    # the completion's targets and their sampling log-probabilities stay
    np.testing.assert_array_equal(masked.completion_mask, kept.completion_mask)
    np.testing.assert_array_equal(masked.values["old_logps"], kept.values["old_logps"])


def test_a_rollout_longer_than_the_rows_is_refused() -> None:
    made, logps = records()
    with pytest.raises(ValueError, match="rollout 1 holds 11 tokens, more than seq_len \\+ 1 = 10"):
        RolloutBatch.build(made, logps, seq_len=SEQ_LEN - 1, pad_id=0)
    with pytest.raises(ValueError, match="rollout 0: 3 completion tokens but 2"):
        RolloutBatch.build(made, [logps[0][:2], *logps[1:]], seq_len=SEQ_LEN, pad_id=0)


def test_shares_and_micro_batches_are_contiguous_blocks() -> None:
    made, logps = records()
    ref = np.arange(4 * SEQ_LEN, dtype=np.float32).reshape(4, SEQ_LEN)
    batch = RolloutBatch.build(made, logps, seq_len=SEQ_LEN, pad_id=0).with_values(ref_logps=ref)
    second = batch.rows_of(rank=1, ranks=2)
    assert [r.index for r in second.records] == [2, 3]
    np.testing.assert_array_equal(second.rows.inputs, batch.rows.inputs[2:])
    np.testing.assert_array_equal(second.values["ref_logps"], ref[2:])
    np.testing.assert_array_equal(second.values["advantages"], batch.values["advantages"][2:])
    assert second.rows.documents.tolist() == [[2], [3]]  # indices in the step, not the share
    micro = list(batch.micro_batches(1))
    assert [m.records[0].index for m in micro] == [0, 1, 2, 3]
    np.testing.assert_array_equal(
        np.concatenate([m.rows.loss_mask for m in micro]), batch.rows.loss_mask
    )
    with pytest.raises(ValueError, match="4 rollouts cannot be shared by 3"):
        batch.rows_of(rank=0, ranks=3)
    with pytest.raises(ValueError, match="micro-batches of 3 rows"):
        list(batch.micro_batches(3))
    with pytest.raises(ValueError, match="value 'x' has 3 rows"):
        batch.with_values(x=np.zeros((3, 1)))


def test_state_round_trips_exactly_through_json_and_npz(tmp_path: Path) -> None:
    made, logps = records(step=7)
    ref = np.random.default_rng(1).standard_normal((4, SEQ_LEN)).astype(np.float32)
    batch = RolloutBatch.build(
        made, logps, seq_len=SEQ_LEN, pad_id=0, mask_truncated_completions=True
    ).with_values(ref_logps=ref)
    arrays, saved = batch.to_state()
    np.savez(tmp_path / "state.npz", **arrays)
    (tmp_path / "records.json").write_text(json.dumps(saved))
    with np.load(tmp_path / "state.npz") as loaded:
        back = RolloutBatch.from_state(
            dict(loaded), json.loads((tmp_path / "records.json").read_text())
        )
    for name in ("inputs", "targets", "loss_mask", "positions", "segments", "documents"):
        got, want = getattr(back.rows, name), getattr(batch.rows, name)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    assert set(back.values) == {"old_logps", "advantages", "ref_logps"}
    for name, array in batch.values.items():
        assert back.values[name].tobytes() == array.tobytes(), name
    assert back.completion_mask.tobytes() == batch.completion_mask.tobytes()
    # records: equal field by field (NaN rewards come back as NaN)
    for got, want in zip(back.records, batch.records, strict=True):
        assert got.to_json() == want.to_json()
    assert math.isnan(back.records[2].reward) and back.records[3].rewards["format"] is None
    assert saved[2]["reward"] is None  # JSON holds no NaN


def test_prompt_order_is_a_seeded_permutation_per_epoch_and_resumes() -> None:
    order = PromptOrder(num_prompts=10, per_step=3, seed=5)
    steps = [order.next_step() for _ in range(7)]
    epoch0, epoch1 = steps[:3], steps[3:6]
    assert len({i for s in epoch0 for i in s}) == 9  # each prompt once; the tail of 1 left out
    assert [i for s in epoch1 for i in s] != [i for s in epoch0 for i in s]
    assert PromptOrder(num_prompts=10, per_step=3, seed=6).next_step() != steps[0]

    replay = PromptOrder(num_prompts=10, per_step=3, seed=5)
    for _ in range(4):
        replay.next_step()
    resumed = PromptOrder(num_prompts=10, per_step=3, seed=5)
    resumed.load_state_dict(json.loads(json.dumps(replay.state_dict())))
    assert [resumed.next_step() for _ in range(3)] == steps[4:7]

    with pytest.raises(DataError, match="seed 6; resume with the prompts, seed and batch"):
        PromptOrder(num_prompts=10, per_step=3, seed=6).load_state_dict(replay.state_dict())
    with pytest.raises(DataError, match="hold 2 prompts, fewer than the 3 each step needs"):
        PromptOrder(num_prompts=2, per_step=3, seed=0)
