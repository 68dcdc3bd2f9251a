"""``--generator recorded:FILE.jsonl``: a rollout phase replays the completions of a
rollouts file (the fixed batch TRL trains on in the engines' GRPO parity tests), with
their sampling log-probabilities, and scores them as TRL does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from baton.backends.rollouts.phase import build_rollout_phase
from baton.backends.rollouts.recorded import RecordedGenerator
from baton.core.errors import UsageError
from baton.core.objectives import ObjectiveRun
from baton.core.rollouts.generator import Sampling
from baton.data import load_tokenizer
from support.grpo import GENERATIONS, MAX_COMPLETION, PROMPTS, TEMPERATURE, read_rollouts

pytestmark = pytest.mark.slow


def phase_of(files, **settings):
    run = ObjectiveRun.of(
        "grpo",
        reward=(f"tests/support/grpo_rewards.py:recorded:path={files['rollouts']}",),
        generator=f"recorded:{files['rollouts']}",
        num_generations=GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        temperature=TEMPERATURE,
        **settings,
    )
    return build_rollout_phase(
        run.values,
        prompts=files["prepared"],
        policy=files["policy"],
        tokenizer=load_tokenizer(files["tokenizer"]),
        rows_per_step=PROMPTS * GENERATIONS,
        seed=0,
        gather_weights=lambda: {},  # the recorded generator samples nothing
        broadcast=lambda value: value,
        is_first_rank=True,
    )


def test_a_phase_replays_the_files_completions_and_scores_them_as_trl(grpo_assets):
    files = grpo_assets["files"]
    step = phase_of(files).before_step(1)
    recorded = read_rollouts(files["rollouts"])
    by_prompt = {}
    for record in recorded:
        by_prompt.setdefault(tuple(record["prompt_ids"]), []).append(record)
    assert step.records is not None and len(step.records) == len(recorded)
    old = step.batch.values["old_logps"]
    for row, record in enumerate(step.records):
        expected = by_prompt[tuple(record.prompt_ids)].pop(0)  # the file's order per prompt
        assert record.completion_ids == expected["completion_ids"]
        start = len(record.prompt_ids) - 1
        got = old[row, start : start + len(record.completion_ids)]
        np.testing.assert_allclose(got, np.float32(expected["logps"]), rtol=0, atol=0)
    trl = grpo_assets["reference"]()[0]
    for name in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                 "completions/clipped_ratio"):  # fmt: skip
        assert step.metrics[name] == pytest.approx(trl[name], rel=1e-6), name


def test_a_prompt_with_no_completion_left_and_a_bad_file_are_refused(grpo_assets, tmp_path):
    files = grpo_assets["files"]
    generator = RecordedGenerator(files["rollouts"])
    first = read_rollouts(files["rollouts"])[0]["prompt_ids"]
    sampling = Sampling(max_tokens=MAX_COMPLETION)
    assert len(generator.generate([first] * GENERATIONS, sampling)) == GENERATIONS
    state = generator.state_dict()
    with pytest.raises(UsageError, match="holds no more completions of the prompt"):
        generator.generate([first], sampling)
    again = RecordedGenerator(files["rollouts"])
    again.load_state_dict(state)
    with pytest.raises(UsageError, match="holds no more completions"):
        again.generate([first], sampling)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"prompt_ids": [1], "completion_ids": [2, 3]}) + "\n")
    with pytest.raises(UsageError, match=r"broken.jsonl:1 is not a rollout record"):
        RecordedGenerator(broken)
    with pytest.raises(UsageError, match="no such file"):
        RecordedGenerator(tmp_path / "missing.jsonl")
