"""The rollout phase end to end in one process: a tiny Llama samples G completions of the
prepared prompts, rewards and group advantages, rows, weights loaded only when their
version changes, batches reused for num_iterations steps, the state a resume needs
(saved to files and loaded into a fresh phase: the same completions bit for bit), and the
refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from baton.core.errors import UsageError
from baton.core.rewards.function import Reward
from baton.data import DataError
from baton.data.prompts import PreparedPrompts
from support.rollouts import WeightSource, grpo_settings, make_phase, rollout_files


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return rollout_files(tmp_path_factory.mktemp("rollouts"))


def same_batches(a, b):
    arrays_a, records_a = a.to_state()
    arrays_b, records_b = b.to_state()
    assert records_a == records_b
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        assert arrays_a[name].dtype == arrays_b[name].dtype, name
        assert arrays_a[name].tobytes() == arrays_b[name].tobytes(), name


def test_a_step_samples_groups_scores_them_and_builds_rows(files):
    from transformers import AutoTokenizer

    phase = make_phase(files, num_generations=4, rows_per_step=8)
    prompts = PreparedPrompts(files["prompts"])
    training_rng = torch.get_rng_state()
    step = phase.before_step(1)
    assert torch.equal(torch.get_rng_state(), training_rng)
    batch, records = step.batch, step.records
    assert records is not None and len(records) == batch.size == 8
    assert phase.current is batch and phase.prompts_per_step == 2
    # each prompt G times in a row, its ids as prepared
    chosen = [r.prompt_index for r in records]
    assert chosen[:4] == [chosen[0]] * 4 and chosen[4:] == [chosen[4]] * 4
    assert chosen[0] != chosen[4]
    hf = AutoTokenizer.from_pretrained(files["tokenizer"])
    for row, record in enumerate(records):
        assert record.step == 1 and record.index == row
        assert record.prompt_ids == prompts.ids(record.prompt_index).tolist()
        assert record.completion == hf.decode(record.completion_ids, skip_special_tokens=True)
        first = len(record.prompt_ids) - 1
        n = len(record.completion_ids)
        assert batch.rows.targets[row, first : first + n].tolist() == record.completion_ids
        assert float(batch.values["old_logps"][row].sum(dtype=np.float64)) == pytest.approx(
            record.logp_sum, abs=1e-4
        )
        assert batch.values["advantages"][row, 0] == np.float32(record.advantage)
        # each reward function's value: the built-in length and the file's function, which
        # saw the completion as TRL gives it for turns and the prompt's answer column
        n = len(record.completion_ids)
        assert record.rewards["length"] == -abs(n - 6) / 6
        answer = prompts.record(record.prompt_index)["answer"]
        expected = None if not record.completion.strip() else float(answer in record.completion)
        assert record.rewards["answer_reward"] == expected
    # TRL's group advantages: (r - mean) / (std + 1e-4), the unbiased std of each group
    rewards = torch.tensor([r.reward for r in records], dtype=torch.float64).nan_to_num(0.0)
    grouped = rewards.view(-1, 4)
    mean = grouped.mean(1).repeat_interleave(4)
    std = grouped.std(1).repeat_interleave(4)
    expected = ((rewards - mean) / (std + 1e-4)).float()
    assert [r.advantage for r in records] == pytest.approx(expected.tolist(), abs=1e-5)
    metrics = step.metrics
    for key in (
        "reward",
        "reward_std",
        "rewards/length/mean",
        "rewards/answer_reward/std",
        "frac_reward_zero_std",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "timing/generation_s",
        "timing/weight_sync_s",
    ):
        assert key in metrics, key
    lengths = [len(r.completion_ids) for r in records]
    assert metrics["completions/mean_length"] == pytest.approx(np.mean(lengths))
    assert metrics["completions/max_length"] == max(lengths)
    assert metrics["completions/clipped_ratio"] == np.mean([r.truncated for r in records])
    assert metrics["timing/generation_s"] > 0 and metrics["timing/weight_sync_s"] > 0


def test_weights_are_loaded_only_when_their_version_changes(files):
    source = WeightSource(files["policy"])
    phase = make_phase(files, num_iterations=2, weights=source)
    generator = phase.generator
    first = phase.before_step(1)
    assert (source.calls, generator.loads, generator.version) == (1, 1, 0)
    # step 2 reuses the batch: nothing sampled, no records, no weights gathered
    second = phase.before_step(2)
    assert second.records is None and second.batch is first.batch
    assert source.calls == 1
    assert second.metrics["timing/generation_s"] == 0.0
    assert second.metrics["reward"] == first.metrics["reward"]
    source.scale = 0.5
    third = phase.before_step(3)
    assert (source.calls, generator.loads, generator.version) == (2, 2, 2)
    assert third.records is not None and third.records[0].step == 3
    torch.testing.assert_close(
        generator.model.lm_head.weight, source.base["lm_head.weight"] * 1.5, rtol=0, atol=0
    )


def test_a_resumed_phase_samples_the_same_rollouts_bit_for_bit(files, tmp_path):
    def run(phase, source, steps):
        batches = []
        for step in steps:
            source.scale = 0.1 * (step - 1)  # the weights after step - 1 optimizer steps
            batches.append(phase.before_step(step).batch)
        return batches

    source = WeightSource(files["policy"])
    whole = run(make_phase(files, num_iterations=2, weights=source), source, range(1, 6))
    first = WeightSource(files["policy"])
    killed = make_phase(files, num_iterations=2, weights=first)
    run(killed, first, range(1, 4))  # step 3 sampled a batch that step 4 reuses
    state = killed.save(tmp_path / "rollouts", write=True)
    assert {p.name for p in (tmp_path / "rollouts").iterdir()} == {"arrays.npz", "records.json"}
    assert state["batch"]["sampled_at"] == 3 and "records" not in state["batch"]

    again = WeightSource(files["policy"])
    resumed = make_phase(files, num_iterations=2, weights=again, seed=0)
    resumed.load(tmp_path / "rollouts", state)
    loaded = resumed.current
    same_batches(loaded, whole[2])
    after = run(resumed, again, range(4, 6))
    assert after[0] is loaded  # step 4 trains on the batch step 3 sampled
    same_batches(after[0], whole[3])
    same_batches(after[1], whole[4])
    assert again.calls == 1  # gathered once, for step 5's new batch


def test_a_kl_term_scores_the_rows_with_the_reference(files):
    phase = make_phase(files, beta=0.04)
    batch = phase.before_step(1).batch
    ref = batch.values["ref_logps"]
    assert ref.shape == batch.values["old_logps"].shape
    # the reference has the policy's starting weights: the sampling log-probabilities
    np.testing.assert_allclose(ref, batch.values["old_logps"], rtol=0, atol=3e-5)


def test_truncated_completions_masked(files):
    phase = make_phase(files, max_completion_length=3, mask_truncated_completions=True)
    batch = phase.before_step(1).batch
    truncated = np.array([r.truncated for r in batch.records])
    assert truncated.any()
    assert not batch.rows.loss_mask[truncated].any()
    assert batch.rows.loss_mask[~truncated].any() or truncated.all()


def test_bad_settings_are_refused_naming_the_fix(files):
    with pytest.raises(UsageError, match="--num-generations 3 does not divide the 8 rollouts"):
        make_phase(files, num_generations=3, rows_per_step=8)
    with pytest.raises(UsageError, match="--num-generations 1: .* at least 2"):
        make_phase(files, num_generations=1, rows_per_step=8)
    longest = PreparedPrompts(files["prompts"]).max_prompt_length
    needed = (
        longest + grpo_settings()["max_completion_length"]
    )  # the rows hold the data's longest prompt and completion
    with pytest.raises(UsageError, match=f"pass --seq-len {needed} or more"):
        make_phase(files, seq_len=needed - 1)
    with pytest.raises(
        DataError, match=rf"longer than --max-prompt-length {longest - 1} .*the first: prompt \d+"
    ):
        make_phase(files, max_prompt_length=longest - 1, seq_len=64)

    def needs_solution(prompts, completions, completion_ids, solution):
        return [0.0 for _ in completions]

    with pytest.raises(UsageError, match="takes the column 'solution', which the prompts lack"):
        make_phase(files, rewards=[Reward("needs_solution", needs_solution)])
    with pytest.raises(UsageError, match="--reward-weights gives 1 weights for 2 rewards"):
        make_phase(files, reward_weights=(1.0,))


def test_two_ranks_train_on_shares_of_the_single_process_batches(files, tmp_path):
    """Rank 0 samples, both ranks receive the batch, weights are gathered from halves
    held by each rank, and the state saved after step 3 resumes on both: each rank's
    share of every step is the single-process batch's, bit for bit."""
    from pathlib import Path

    from support.torchrun import torchrun

    worker = Path(__file__).with_name("rollout_ranks_worker.py")
    torchrun(worker, str(files["root"]), str(tmp_path), nproc=2)
    source = WeightSource(files["policy"])
    phase = make_phase(files, num_iterations=2, weights=source)
    for step in range(1, 6):
        source.scale = 0.1 * (step - 1)
        batch = phase.before_step(step).batch
        for rank in (0, 1):
            expected, records = batch.rows_of(rank, 2).to_state()
            with np.load(tmp_path / f"rank{rank}.npz") as got:
                for name, array in expected.items():
                    assert got[f"{step}/{name}"].tobytes() == array.tobytes(), (step, rank, name)
            ran = json.loads((tmp_path / f"rank{rank}.json").read_text())
            assert ran["records"][step - 1] == records
    # both ranks gathered at steps 1, 3 (saved after it) and 5: the collective matched
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text())["gathers"] == 3


def test_completions_nothing_can_score_train_with_zero_advantages(files, tmp_path):
    def unscorable(prompts, completions, completion_ids):
        return [None for _ in completions]

    phase = make_phase(files, rewards=[Reward("unscorable", unscorable)], num_iterations=2)
    step = phase.before_step(1)
    assert all(r.advantage == 0.0 and np.isnan(r.reward) for r in step.records)
    assert np.isnan(step.metrics["reward"]) and np.isnan(step.metrics["rewards/unscorable/mean"])
    state = phase.save(tmp_path / "rollouts", write=True)
    json.dumps(state, allow_nan=False)  # the state baton.json records is strict JSON
    again = make_phase(files, rewards=[Reward("unscorable", unscorable)], num_iterations=2)
    again.load(tmp_path / "rollouts", state)
    reused = again.before_step(2)
    assert reused.records is None and np.isnan(reused.metrics["reward"])
    same_batches(reused.batch, step.batch)
