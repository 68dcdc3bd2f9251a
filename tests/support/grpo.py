"""GRPO fixtures shared by every engine's tests: prompts, a fixed batch of rollouts read
from a file (completions sampled once from the policy, their rewards, and their sampling
log-probabilities, which equal the policy's), and TRL's ``GRPOTrainer`` trained on exactly
those rollouts: the reference outside baton that each engine's steps must equal.

    files = grpo_files(tmp_path)              # tokenizer, policy, prompts.jsonl, rollouts.jsonl
    trl = grpo_reference(files, loss_type="dapo", beta=0.0, steps=1)
    trl[0]["loss"], trl[0]["grad_norm"], trl[0]["clip_ratio/region_mean"]

The rollouts file is in the format of a run's ``logs/rollouts.jsonl`` (``Rollout``
records: ``prompt_ids``, ``completion_ids``, ``logps`` per completion token at the
temperature, ``reward``...), prompt 0's ``num_generations`` completions first. TRL receives
them through its own ``rollout_func`` hook, baton through ``--generator
recorded:FILE.jsonl``; the reward function of both is :func:`recorded_reward`
(``--reward tests/support/grpo_rewards.py:recorded:path=...``), so both sides train on the
same completions scored with the same numbers.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baton.data.rollouts import Rollout
from support.posttrain import WORDS, chat_tokenizer, tiny_model

#: prompts and completions of the fixed batch
PROMPTS, GENERATIONS = 4, 4
#: the longest completion sampled (some are cut there: truncated)
MAX_COMPLETION = 10
#: what the completions were sampled at (and log-probabilities computed at)
TEMPERATURE = 0.9


def grpo_prompts(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` conversational prompts (TRL's format) with an ``answer`` column."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))
        out.append({"prompt": [{"role": "user", "content": words}], "answer": words.split()[0]})
    return out


def _hf_tokenizer(directory: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The ids TRL's ``GRPOTrainer`` gives a prompt: the chat template with the
    generation prompt for turns, the tokenizer's encoding for text."""
    if isinstance(prompt, list):
        rendered = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(rendered["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def completion_logps(
    model: Any, prompt: Sequence[int], completion: Sequence[int], temperature: float
) -> list[float]:
    """Each completion token's log-probability under ``model`` at ``temperature`` (a
    forward over prompt + completion)."""
    import torch

    ids = torch.tensor([[*prompt, *completion]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    return logps.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def sample_rollouts(
    policy: str | Path,
    tokenizer_dir: str | Path,
    prompts: Sequence[dict[str, Any]],
    generations: int = GENERATIONS,
    max_completion: int = MAX_COMPLETION,
    temperature: float = TEMPERATURE,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``generations`` completions of each prompt sampled from ``policy`` (cut after its
    end of document; half of them ended early with it, so lengths differ and some are
    truncated, some not), their log-probabilities and a reward each: rewards differ within
    every group but the last, whose rewards are all equal (a group with zero std)."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = _hf_tokenizer(tokenizer_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).eval()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    records = []
    for index, prompt in enumerate(prompts):
        ids = prompt_ids(tokenizer, prompt["prompt"])
        for g in range(generations):
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    max_new_tokens=max_completion,
                    eos_token_id=eos,
                    pad_token_id=eos,
                )
            completion = out[0, len(ids) :].tolist()
            if eos in completion:
                completion = completion[: completion.index(eos) + 1]
            elif g % 2 == 0:  # the tiny model rarely stops: end half of them early
                completion = [*completion[: 2 + (g + index) % 5], eos]
            last = index == len(prompts) - 1
            reward = 0.5 if last else float((len(completion) * 7 + g) % 5) / 4
            logps = completion_logps(model, ids, completion, temperature)
            record = Rollout(
                step=1,
                index=len(records),
                prompt_index=index,
                prompt_ids=ids,
                completion_ids=completion,
                completion=tokenizer.decode(completion, skip_special_tokens=True),
                rewards={"recorded": reward},
                reward=reward,
                advantage=0.0,
                logp_sum=math.fsum(logps),
                truncated=completion[-1] != eos,
                logps=logps,
            )
            records.append(record.to_json())
    return records


def grpo_files(directory: str | Path, *, seed: int = 0, family: str = "llama") -> dict[str, Path]:
    """A chat tokenizer, a tiny policy of ``family`` (``support.posttrain.tiny_model``),
    ``prompts.jsonl`` (TRL's prompt format), those prompts prepared by ``baton data
    prepare`` (``prepared``, a prefix) and ``rollouts.jsonl`` (the fixed batch) under
    ``directory``."""
    from baton.tools.data.cli import main

    root = Path(directory)
    tokenizer = chat_tokenizer(root / "tok")
    policy = tiny_model(root / "policy", family=family, seed=seed)
    prompts = grpo_prompts(PROMPTS, seed)
    prompts_file = root / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    prepared = root / "prompts"
    status = main(
        ["prepare", str(prompts_file), "--tokenizer", str(tokenizer), "--output", str(prepared)]
    )
    if status != 0:
        raise AssertionError(f"baton data prepare failed ({status})")
    rollouts = root / "rollouts.jsonl"
    records = sample_rollouts(policy, tokenizer, prompts, seed=seed)
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {
        "tokenizer": tokenizer,
        "policy": policy,
        "prompts": prompts_file,
        "prepared": prepared,
        "rollouts": rollouts,
    }


def grpo_flags(files: dict[str, Path], **settings: Any) -> list[str]:
    """The command line of a GRPO run on the fixed rollouts (every prompt in one step),
    to append to a recipe's own flags; ``settings`` (TRL's names, e.g. ``beta=0.04``)
    override the defaults."""
    values: dict[str, Any] = {
        "num_generations": GENERATIONS,
        "max_completion_length": MAX_COMPLETION,
        "temperature": TEMPERATURE,
        "top_k": 0,
        **settings,
    }
    flags = [
        "--objective", "grpo",
        "--data-path", str(files["prepared"]),
        "--tokenizer", str(files["tokenizer"]),
        "--init-from", str(files["policy"]),
        "--generator", f"recorded:{files['rollouts']}",
        "--reward", f"{Path(__file__).with_name('grpo_rewards.py')}:recorded:path={files['rollouts']}",
    ]  # fmt: skip
    for name, value in values.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def recorded_reward(
    prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], *, path: str,
    **columns: Any,
) -> list[float | None]:  # fmt: skip
    """TRL's reward signature: each completion's reward as the rollouts file records it
    (looked up by its prompt's and its own token ids)."""
    del prompts, completions
    table = {tuple(r["completion_ids"]): r["reward"] for r in read_rollouts(path)}
    return [table[tuple(ids)] for ids in completion_ids]


def grpo_reference(
    files: dict[str, Path],
    *,
    loss_type: str = "dapo",
    beta: float = 0.0,
    steps: int = 1,
    num_iterations: int = 1,
    lr: float = 1e-3,
    epsilon: float = 0.2,
    temperature: float = TEMPERATURE,
    scale_rewards: str = "group",
) -> list[dict[str, float]]:
    """TRL's ``GRPOTrainer`` (CPU, fp32, AdamW with TRL's defaults, a constant learning
    rate, clipping at 1.0) on the fixed rollouts, every prompt in one step's batch:
    each step's logged ``loss``, ``grad_norm`` and metrics. ``steps`` must not exceed
    ``num_iterations`` (the fixed batch is one generation)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    if steps > num_iterations:
        raise ValueError("the fixed rollouts are one batch: steps <= num_iterations")
    records = read_rollouts(files["rollouts"])
    prompts = [json.loads(line) for line in Path(files["prompts"]).read_text().splitlines()]
    tokenizer = _hf_tokenizer(files["tokenizer"])
    generations = len(records) // len(prompts)
    for record in records:
        expected = prompt_ids(tokenizer, prompts[record["prompt_index"]]["prompt"])
        if record["prompt_ids"] != expected:
            raise AssertionError("the rollouts file's prompt ids are not TRL's tokenization")

    def replay(batch_prompts: list[Any], trainer: Any) -> dict[str, Any]:
        taken: dict[int, int] = {}
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in batch_prompts:
            index = next(i for i, p in enumerate(prompts) if p["prompt"] == prompt)
            g = taken.get(index, 0)
            taken[index] = g + 1
            record = records[index * generations + g]
            out["prompt_ids"].append(record["prompt_ids"])
            out["completion_ids"].append(record["completion_ids"])
            out["logprobs"].append(record["logps"])
        return out

    def recorded(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                 **columns: Any) -> list[float | None]:  # fmt: skip
        return recorded_reward(
            prompts, completions, completion_ids, path=str(files["rollouts"]), **columns
        )

    with tempfile.TemporaryDirectory() as output:
        config = GRPOConfig(
            output_dir=output,
            per_device_train_batch_size=len(records),
            num_generations=generations,
            max_completion_length=max(len(r["completion_ids"]) for r in records),
            temperature=temperature,
            top_k=0,
            beta=beta,
            epsilon=epsilon,
            loss_type=loss_type,
            num_iterations=num_iterations,
            scale_rewards=scale_rewards,
            learning_rate=lr,
            lr_scheduler_type="constant",
            max_steps=steps,
            logging_steps=1,
            shuffle_dataset=False,
            report_to="none",
            use_cpu=True,
            bf16=False,
            fp16=False,
            save_strategy="no",
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(files["policy"]), dtype=torch.float32),
            reward_funcs=[recorded],
            args=config,
            train_dataset=datasets.Dataset.from_list(prompts),
            processing_class=tokenizer,
            rollout_func=replay,
        )
        trainer.train()
        logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return [
        {k: float(v) for k, v in entry.items() if isinstance(v, int | float)} for entry in logged
    ]


#: the learning task's schedule: steps, and how much the mean reward must rise
LEARNING_STEPS, LEARNING_MARGIN = 30, 0.12


def grpo_assets(directory: str | Path, *, family: str = "llama") -> dict[str, Any]:
    """``{"files": grpo_files(directory, family=...), "reference": reference}``, where
    ``reference(**settings)`` is ``grpo_reference(files, **settings)`` (TRL's
    ``GRPOTrainer`` steps on the fixed rollouts), each setting computed once: what the
    session fixtures hand every engine's tests."""
    files = grpo_files(directory, family=family)
    computed: dict[tuple, list] = {}

    def reference(**settings: Any) -> list[dict[str, float]]:
        key = tuple(sorted(settings.items()))
        if key not in computed:
            computed[key] = grpo_reference(files, **settings)
        return computed[key]

    return {"files": files, "reference": reference}


def learning_flags(files: dict[str, Path], **settings: Any) -> list[str]:
    """A GRPO run that learns on a CPU (``grpo_rewards.vowel_start``): 2 prompts x 8
    completions of up to 8 tokens a step, sampled by the transformers generator from the
    policy's current weights, a constant learning rate of 5e-3 (``--lr`` and the batch
    size are the recipe's flags: pass ``--batch-size 16 --lr 5e-3``)."""
    values: dict[str, Any] = {
        "num_generations": 8,
        "max_completion_length": 8,
        "temperature": 1.0,
        **settings,
    }
    flags = [
        "--objective", "grpo",
        "--data-path", str(files["prepared"]),
        "--tokenizer", str(files["tokenizer"]),
        "--init-from", str(files["policy"]),
        "--reward", f"{Path(__file__).with_name('grpo_rewards.py')}:vowel_start",
        "--max-steps", str(LEARNING_STEPS),
    ]  # fmt: skip
    for name, value in values.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def learned(rewards: Sequence[float], margin: float = LEARNING_MARGIN) -> bool:
    """Whether the mean reward of the last five steps beats the first five's by
    ``margin``."""
    return sum(rewards[-5:]) / 5 >= sum(rewards[:5]) / 5 + margin
