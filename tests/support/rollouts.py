"""Rollout fixtures: a chat tokenizer, a tiny Llama policy, prompts prepared by `baton data
prepare` from prompt-only records, and a rollout phase over them in one process.

    files = rollout_files(tmp_path)              # tokenizer, policy, prompts (conversational)
    phase = make_phase(files, num_generations=4, rows_per_step=8)
    step = phase.before_step(1)                  # RolloutStep(batch, records, metrics)

The phase's weights come from a real ``transformers`` model's ``state_dict``
(``WeightSource``), scaled by a value a test moves between steps, so that each version
holds other weights.
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


def rollout_files(root: Path) -> dict[str, Path]:
    """The chat tokenizer, a tiny Llama policy and its prompts prepared with `baton data
    prepare` (seven conversational prompts with an ``answer`` column)."""
    from baton.tools.data.cli import main
    from support.posttrain import chat_tokenizer, tiny_model

    tokenizer = chat_tokenizer(root / "tok")
    policy = tiny_model(root / "policy")
    source = root / "prompts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in PROMPT_RECORDS), encoding="utf-8")
    prefix = root / "prompts"
    status = main(["prepare", str(source), "--tokenizer", str(tokenizer), "--output", str(prefix)])
    assert status == 0, status
    return {"tokenizer": tokenizer, "policy": policy, "prompts": prefix, "root": root}


def words_reward(completions: Sequence[Any], **_: Any) -> list[float | None]:
    """A reward with TRL's signature: the completion's word count (turns: the last's)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t.split())) for t in texts]


def answer_reward(
    completions: Sequence[Any], answer: Sequence[str], **_: Any
) -> list[float | None]:
    """A reward reading a column: 1.0 where the completion holds the answer's digits,
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


def make_phase(
    files: Mapping[str, Path],
    *,
    num_generations: int = 4,
    rows_per_step: int = 8,
    num_iterations: int = 1,
    max_tokens: int = 12,
    seed: int = 0,
    weights: WeightSource | None = None,
    reference: bool = False,
    mask_truncated: bool = False,
    **overrides: Any,
) -> Any:
    """A ``RolloutPhase`` in one process (the first rank; broadcast is the identity)."""
    from transformers import AutoTokenizer

    from baton.backends.rollouts.hf_generator import TransformersGenerator
    from baton.backends.rollouts.phase import RolloutPhase, RolloutSettings
    from baton.backends.rollouts.scoring import ReferenceScorer
    from baton.core.rollouts.generator import Sampling
    from baton.data import load_tokenizer
    from baton.data.prompts import PreparedPrompts

    info = load_tokenizer(files["tokenizer"])
    hf = AutoTokenizer.from_pretrained(files["tokenizer"])
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    sampling = Sampling(
        temperature=0.9,
        top_p=1.0,
        top_k=0,
        max_tokens=max_tokens,
        stop_ids=(info.eod_id, im_end),
        pad_id=hf.pad_token_id,
    )
    settings = RolloutSettings(
        num_generations=num_generations,
        sampling=sampling,
        max_prompt_length=32,
        num_iterations=num_iterations,
        mask_truncated_completions=mask_truncated,
    )
    keywords: dict[str, Any] = {
        "prompts": PreparedPrompts(files["prompts"]),
        "seed": seed,
        "generator": TransformersGenerator(files["policy"], seed=seed),
        "rewards": {"words": words_reward, "answer": answer_reward},
        "reward_weights": [0.1, 1.0],
        "reference": (
            ReferenceScorer(files["policy"], temperature=sampling.temperature)
            if reference
            else None
        ),
        "settings": settings,
        "rows_per_step": rows_per_step,
        "seq_len": 32 + max_tokens,
        "decode": lambda ids: hf.decode(list(ids), skip_special_tokens=True),
        "gather_weights": weights if weights is not None else WeightSource(files["policy"]),
        "broadcast": lambda value: value,
        "is_first_rank": True,
    }
    keywords.update(overrides)
    return RolloutPhase(**keywords)
