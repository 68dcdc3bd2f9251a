"""Rollout fixtures: a chat tokenizer, a tiny Llama policy, prompts prepared by `baton data
prepare` from prompt-only records, and a rollout phase over them in one process, built
as a recipe builds it (``build_rollout_phase``).

    files = rollout_files(tmp_path)              # tokenizer, policy, prompts (conversational)
    phase = make_phase(files, num_generations=4, rows_per_step=8)
    step = phase.before_step(1)                  # RolloutStep(batch, records, metrics)

The phase's weights come from a real ``transformers`` model's ``state_dict``
(``WeightSource``), scaled by a value a test moves between steps (or reads from a
backend), so that each version holds other weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: prompt-only records in TRL's format: turns, and a column for the rewards
PROMPT_RECORDS = [
    {"prompt": [{"role": "user", "content": text}], "answer": str(len(text.split()))}
    for text in (
        "the model reads a short story about rivers",
        "why cats sleep all day",
        "trains run through cities at night",
        "each question with care",
        "small tests need clear data",
        "bright stars over mountains",
        "the assistant explains how trains run",
    )
]
#: the rewards of ``make_phase``: a built-in and a function from a file, TRL's signature
REWARDS = ("length:target=6", f"{Path(__file__).resolve()}:answer_reward")
REWARD_WEIGHTS = (0.5, 1.0)


def rollout_files(root: Path) -> dict[str, Path]:
    """The chat tokenizer, a tiny Llama policy (its ``generation_config.json`` stops at
    the end of a turn, as a chat export's does) and its prompts prepared with `baton data
    prepare` (seven conversational prompts with an ``answer`` column)."""
    from transformers import AutoTokenizer

    from baton.tools.data.cli import main
    from support.posttrain import chat_tokenizer, tiny_model

    tokenizer = chat_tokenizer(root / "tok")
    policy = tiny_model(root / "policy")
    hf = AutoTokenizer.from_pretrained(tokenizer)
    stops = [hf.eos_token_id, hf.convert_tokens_to_ids("<|im_end|>")]
    (policy / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    source = root / "prompts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in PROMPT_RECORDS), encoding="utf-8")
    prefix = root / "prompts"
    status = main(["prepare", str(source), "--tokenizer", str(tokenizer), "--output", str(prefix)])
    assert status == 0, status
    return {"tokenizer": tokenizer, "policy": policy, "prompts": prefix, "root": root}


def answer_reward(
    prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], answer: list[str]
) -> list[float | None]:
    """A reward reading a column: 1.0 where the completion's text holds the answer,
    ``None`` (unscorable) for an empty completion."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [None if not t.strip() else float(a in t) for t, a in zip(texts, answer, strict=True)]


class WeightSource:
    """The policy's weights by Hugging Face name: a real model's tensors, the LM head
    scaled by ``1 + scale`` (a test moves ``scale`` as training would move the weights,
    or ``scale_of`` reads it from a backend's state)."""

    def __init__(self, policy: Path, scale_of: Callable[[], float] | None = None) -> None:
        from support.tiny_llama import load_llama

        self.base = load_llama(policy).state_dict()
        self.scale = 0.0
        self.scale_of = scale_of
        self.calls = 0

    def __call__(self) -> Mapping[str, Any]:
        self.calls += 1
        scale = self.scale if self.scale_of is None else self.scale_of()
        return {**self.base, "lm_head.weight": self.base["lm_head.weight"] * (1.0 + scale)}


def grpo_settings(**overrides: Any) -> dict[str, Any]:
    """GRPO settings by TRL's names, small enough for a CPU test."""
    settings: dict[str, Any] = {
        "num_generations": 4,
        "max_prompt_length": 32,
        "max_completion_length": 12,
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 0,
        "num_iterations": 1,
        "mask_truncated_completions": False,
        "scale_rewards": "group",
        "beta": 0.0,
        "reference": None,
        "reward": REWARDS,
        "reward_weights": REWARD_WEIGHTS,
    }
    unknown = set(overrides) - set(settings)
    assert not unknown, unknown
    return settings | overrides


def make_phase(
    files: Mapping[str, Path],
    *,
    rows_per_step: int = 8,
    seed: int = 0,
    weights: WeightSource | None = None,
    seq_len: int | None = None,
    rewards: Sequence[Any] | None = None,
    is_first_rank: bool = True,
    gather_weights: Callable[[], Mapping[str, Any] | None] | None = None,
    broadcast: Callable[[Any], Any] | None = None,
    **settings: Any,
) -> Any:
    """A ``RolloutPhase`` (by default in one process: the first rank, weights from a
    ``WeightSource``, broadcast the identity)."""
    from baton.backends.rollouts.phase import build_rollout_phase
    from baton.data import load_tokenizer

    return build_rollout_phase(
        grpo_settings(**settings),
        prompts=files["prompts"],
        policy=files["policy"],
        tokenizer=load_tokenizer(files["tokenizer"]),
        rows_per_step=rows_per_step,
        seed=seed,
        gather_weights=gather_weights or weights or WeightSource(files["policy"]),
        broadcast=broadcast or (lambda value: value),
        is_first_rank=is_first_rank,
        seq_len=seq_len,
        rewards=rewards,
    )
