"""Post-training against TRL, side by side: packing efficiency, SFT and DPO time per step.

* **packing**: the fraction of non-padding tokens when baton's best-fit-decreasing
  (``baton.tools.data.packing``) and TRL's ``pack_dataset(strategy="bfd")`` pack the
  same documents (a log-normal spread of conversation lengths) into rows of the same
  capacity. Target: baton >= TRL.
* **sft_step**: time per optimizer step of ``recipes/hf_finetune.py --objective sft``
  (Fabric, packed rows through ``transformers``) and of TRL's ``SFTTrainer`` (``packing``
  with its BFD, padding-free) on the same Llama, the same documents and the same rows
  per step. Target: <= 1.0.
* **dpo_step**: the same for ``--objective dpo`` with the reference's log-probabilities
  precomputed (before the first step, not timed) against ``DPOTrainer`` computing its
  reference live, each step the same number of pairs. Target: <= 0.7.

Both steps run at the same precision: TRL's trainers default to ``bf16=True`` (bf16
autocast, on a CPU too) and gradient checkpointing; baton's runs are given
``--precision bf16-mixed`` (``BATON_PRECISION``), the same autocast. TRL keeps the rest of
its defaults (gradient checkpointing, a live reference model).

* **chat_prepare**: tokens per second of ``baton data prepare`` on conversations (``.jsonl``
  of ``messages``; rendering, masks, packing and writing included) against
  ``apply_chat_template(tokenize=True)`` alone on the same conversations, one call per
  conversation as TRL maps a dataset (the target's baseline) and, for comparison, all of
  them in one batched call (the texts in one ``encode_batch`` on the tokenizer's threads),
  each with the tokenizer loaded from its directory, for a ChatML template with ``{% generation %}``
  tags (transformers marks the assistant's tokens) and one without (baton renders each
  conversation's prefixes to find them). One warm-up round (imports), then 7 rounds
  taking turns, garbage collected before each side (a full collection of the heap this
  process has loaded costs about 0.1 s, a third of a side). Target: >= 0.8.

Each round builds both runs afresh and times their steps after the first two (callbacks
at step start and end); the ratio is the median over rounds of the paired medians.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Row, median, paired_ratio

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
#: baton's precision in the timed steps: TRL's default ``bf16=True`` is bf16 autocast, on
#: a CPU as well (where the CPU has bf16 instructions its matrix products run ~3x faster
#: than in float32), so baton runs the same autocast
BATON_PRECISION = "bf16-mixed"
WORDS = (
    "the model reads a short story about rivers and mountains then answers each question "
    "with care because tests need clear data so every turn stays brief while the assistant "
    "explains how trains run through cities at night under bright stars"
).split()


def document_lengths(count: int, capacity: int, seed: int = 0) -> list[int]:
    """Conversation lengths in tokens: log-normal (median capacity / 4), 16..capacity."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(capacity / 4), 0.7, size=count).astype(int)
    return [int(n) for n in np.clip(lengths, 16, capacity)]


def packing_rows(quick: bool) -> list[Row]:
    import datasets
    from trl.data_utils import pack_dataset

    from baton.tools.data.packing import best_fit_decreasing, fill

    capacity = 2048
    lengths = document_lengths(500 if quick else 5000, capacity)
    ours = fill(lengths, best_fit_decreasing(lengths, capacity), capacity)
    table = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    packed = pack_dataset(table, capacity, strategy="bfd")
    theirs = sum(lengths) / (len(packed) * capacity)
    return [
        Row("posttrain", "packing: TRL bfd", theirs * 100, "% filled"),
        Row(
            "posttrain",
            "packing: baton bfd",
            ours * 100,
            "% filled",
            ratio=ours / theirs,
            baseline="packing: TRL bfd",
            target=">= 1.0",
            passed=ours >= theirs,
        ),
    ]


class StepTimes:
    """Wall time of each step (a baton callback and a transformers TrainerCallback)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def begin(self) -> None:
        self._start = time.perf_counter()

    def end(self) -> None:
        self.times.append(time.perf_counter() - self._start)

    def per_step(self, skip: int = 2) -> float:
        return statistics.median(self.times[skip:])


def _baton_callback(times: StepTimes) -> Any:
    from baton.core import Callback

    class Timed(Callback):
        def on_step_start(self, driver: Any) -> None:
            times.begin()

        def on_step_end(self, driver: Any, output: Any) -> None:
            times.end()

    return Timed()


def _trl_callback(times: StepTimes) -> Any:
    from transformers import TrainerCallback

    class Timed(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.end()

    return Timed()


def make_files(root: Path, quick: bool) -> dict[str, Any]:
    """A tokenizer, a Llama for it, and text pairs."""
    import torch
    import transformers

    from baton.data import train_tokenizer

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(200)]
    train_tokenizer(root / "tok", vocab_size=512, texts=texts)
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "tok")
    hidden = 64 if quick else 256
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
        num_hidden_layers=2 if quick else 4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "model")
    return {"tok": root / "tok", "model": root / "model", "tokenizer": tokenizer}


def sft_documents(count: int, capacity: int, vocab: int) -> list[tuple[list[int], list[int]]]:
    """Token documents of realistic lengths; the last 60% of each is the completion."""
    rng = np.random.default_rng(1)
    docs = []
    for n in document_lengths(count, capacity, seed=1):
        tokens = rng.integers(2, vocab, size=n).tolist()
        prompt = int(n * 0.4)
        docs.append((tokens, [0] * prompt + [1] * (n - prompt)))
    return docs


def write_rows(prefix: Path, groups: list[list[tuple[list[int], list[int]]]], objective: str,
               seq_len: int, tok: Path) -> int:  # fmt: skip
    """Pack groups of documents by best-fit decreasing into rows of seq_len + 1 tokens."""
    from baton.data import load_tokenizer
    from baton.data.packed import write_packed
    from baton.tools.data.packing import best_fit_decreasing

    lengths = [sum(len(t) for t, _ in group) for group in groups]
    rows = best_fit_decreasing(lengths, seq_len + 1)
    packed = [[doc for g in row for doc in groups[g]] for row in rows]
    write_packed(
        prefix, packed, objective=objective, seq_len=seq_len, tokenizer=load_tokenizer(tok)
    )
    return len(packed)


def baton_run(files: dict[str, Any], run_dir: Path, steps: int, *args: str) -> StepTimes:
    from baton.core.cli.recipe import build_driver

    times = StepTimes()
    driver = build_driver(
        RECIPE,
        ["--init-from", str(files["model"]), "--tokenizer", str(files["tok"]),
         "--max-steps", str(steps), "--log-every", "10", "--eval-every", "0",
         "--save-every", "0", "--no-progress", "--run-dir", str(run_dir),
         "--precision", BATON_PRECISION, *args],
    )  # fmt: skip
    driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
    driver.callbacks.append(_baton_callback(times))
    driver.fit()
    return times


def _trl_args(config_type: Any, output: Path, steps: int, batch: int, **extra: Any) -> Any:
    return config_type(
        output_dir=str(output), max_steps=steps, per_device_train_batch_size=batch,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, report_to="none", use_cpu=True, logging_steps=10,
        save_strategy="no", dataloader_num_workers=0, seed=0,
        bf16=True,  # TRL's default (autocast, on a CPU too): BATON_PRECISION matches it
        **extra,
    )  # fmt: skip


def sft_round(files: dict[str, Any], root: Path, steps: int, rows: int, capacity: int,
              docs: list) -> tuple[float, float]:  # fmt: skip
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer

    times = StepTimes()
    trainer = SFTTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(files["model"]),
        args=_trl_args(
            SFTConfig, root / "trl", steps, rows, packing=True, packing_strategy="bfd",
            max_length=capacity, completion_only_loss=True,
        ),
        train_dataset=datasets.Dataset.from_dict(
            {"input_ids": [t for t, _ in docs], "completion_mask": [m for _, m in docs]}
        ),
        processing_class=files["tokenizer"],
        callbacks=[_trl_callback(times)],
    )  # fmt: skip
    trainer.train()
    ours = baton_run(
        files, root / "baton", steps, "--objective", "sft", "--data-path", str(root / "sft"),
        "--batch-size", str(rows),
    )  # fmt: skip
    return ours.per_step(), times.per_step()


def text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def dpo_pairs(count: int, scale: int) -> list[dict[str, str]]:
    rng = random.Random(2)
    return [
        {"prompt": text(rng, scale, 3 * scale), "chosen": " " + text(rng, scale, 3 * scale),
         "rejected": " " + text(rng, scale, 3 * scale)}
        for _ in range(count)
    ]  # fmt: skip


def pair_documents(tokenizer: Any, pair: dict[str, str]) -> list[tuple[list[int], list[int]]]:
    """The pair as TRL tokenizes a standard (text) pair: the EOS appended to completions."""
    prompt = tokenizer(pair["prompt"])["input_ids"]
    docs = []
    for side in ("chosen", "rejected"):
        full = tokenizer(pair["prompt"] + pair[side] + tokenizer.eos_token)["input_ids"]
        docs.append((full, [0] * len(prompt) + [1] * (len(full) - len(prompt))))
    return docs


def dpo_round(files: dict[str, Any], root: Path, steps: int, rows: int, pairs_per_step: int,
              pairs: list[dict[str, str]]) -> tuple[float, float]:  # fmt: skip
    import datasets
    import transformers
    from trl import DPOConfig, DPOTrainer

    times = StepTimes()
    model = transformers.AutoModelForCausalLM
    trainer = DPOTrainer(
        model=model.from_pretrained(files["model"]),
        ref_model=model.from_pretrained(files["model"]),
        args=_trl_args(DPOConfig, root / "trl", steps, pairs_per_step, max_length=None),
        train_dataset=datasets.Dataset.from_list(pairs),
        processing_class=files["tokenizer"],
        callbacks=[_trl_callback(times)],
    )  # fmt: skip
    trainer.train()
    ours = baton_run(
        files, root / "baton", steps, "--objective", "dpo", "--data-path", str(root / "pairs"),
        "--batch-size", str(rows),
    )  # fmt: skip
    return ours.per_step(), times.per_step()


#: a ChatML template; ``{marks}`` is where the assistant's content goes
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{marks}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
ASSISTANT = "{{- message['content'] + '<|im_end|>' }}"
TEMPLATES = {
    "generation tags": CHATML.replace(
        "{marks}", "{% generation %}" + ASSISTANT + "{% endgeneration %}"
    ),
    "plain template": CHATML.replace("{marks}", ASSISTANT),
}


def conversations(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """``count`` conversations of one to three user/assistant exchanges."""
    rng = random.Random(seed)
    talks = []
    for _ in range(count):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns.append({"role": "user", "content": text(rng, 8, 40)})
            turns.append({"role": "assistant", "content": text(rng, 16, 80)})
        talks.append(turns)
    return talks


def chat_prepare_rows(files: dict[str, Any], root: Path, quick: bool) -> list[Row]:
    """``baton data prepare`` on conversations against ``apply_chat_template`` alone."""
    import gc
    import json

    import transformers

    from baton.tools.data.posttrain import prepare_posttrain

    talks = conversations(100 if quick else 600)
    data = root / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in talks))
    rows: list[Row] = []
    for name, template in TEMPLATES.items():
        directory = root / f"tok-{name.split()[0]}"
        tokenizer = transformers.AutoTokenizer.from_pretrained(files["tok"])
        tokenizer.chat_template = template
        tokenizer.save_pretrained(directory)
        alone, batched, ours = [], [], []
        tokens = 0
        warmup = 1  # the first round imports the tokenizer's modules
        for _ in range(warmup + (1 if quick else 7)):
            gc.collect()  # neither side pays for the other's garbage
            started = time.perf_counter()
            loaded = transformers.AutoTokenizer.from_pretrained(directory)
            rendered = [
                loaded.apply_chat_template(m, tokenize=True, return_dict=True) for m in talks
            ]
            alone.append(time.perf_counter() - started)
            tokens = sum(len(r["input_ids"]) for r in rendered)
            del rendered
            gc.collect()
            started = time.perf_counter()
            loaded = transformers.AutoTokenizer.from_pretrained(directory)
            together = loaded.apply_chat_template(talks, tokenize=True, return_dict=True)
            batched.append(time.perf_counter() - started)
            del together
            gc.collect()
            started = time.perf_counter()
            prepare_posttrain([data], directory, root / "chats", seq_len=1024, force=True)
            ours.append(time.perf_counter() - started)
        alone, batched, ours = alone[warmup:], batched[warmup:], ours[warmup:]
        ratio = paired_ratio(alone, ours)  # tokens/s of prepare over tokens/s alone
        against_batched = paired_ratio(batched, ours)
        rate = tokens / median(alone)
        case = f"chat prepare, {name}"
        rows += [
            Row(
                "posttrain", f"apply_chat_template alone, {name}", rate / 1e3, "k tokens/s",
                note=f"{len(talks)} conversations, {tokens} tokens",
            ),
            Row(
                "posttrain", f"apply_chat_template alone, one batched call, {name}",
                tokens / median(batched) / 1e3, "k tokens/s",
                note="all conversations in one call: texts tokenized in one encode_batch",
            ),
            Row(
                "posttrain", case, tokens / median(ours) / 1e3, "k tokens/s", ratio=ratio,
                baseline=f"apply_chat_template alone, {name}", target=">= 0.8",
                passed=ratio >= 0.8, note="render, mask, pack, write",
            ),
            Row(
                "posttrain", f"{case}, against one batched call", tokens / median(ours) / 1e3,
                "k tokens/s", ratio=against_batched,
                baseline=f"apply_chat_template alone, one batched call, {name}",
                note="for comparison: no target",
            ),
        ]  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    import shutil

    import transformers

    transformers.logging.set_verbosity_error()
    out = packing_rows(quick)
    rounds, steps, rows = (1, 4, 2) if quick else (3, 6, 4)
    capacity = 256 if quick else 512
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        files = make_files(root, quick)
        docs = sft_documents(60 if quick else 400, capacity, len(files["tokenizer"]))
        write_rows(root / "sft", [[d] for d in docs], "sft", capacity - 1, files["tok"])
        pairs = dpo_pairs(40 if quick else 200, 8 if quick else 30)
        groups = [pair_documents(files["tokenizer"], p) for p in pairs]
        packed_rows = write_rows(root / "pairs", groups, "preference", capacity - 1, files["tok"])
        pairs_per_row = len(pairs) / packed_rows
        pairs_per_step = max(1, round(rows * pairs_per_row))
        out += chat_prepare_rows(files, root, quick)
        ours_sft, trl_sft, ours_dpo, trl_dpo = [], [], [], []
        for round_index in range(rounds):
            for name in ("baton", "trl"):
                shutil.rmtree(root / name, ignore_errors=True)
            a, b = sft_round(files, root, steps, rows, capacity, docs)
            ours_sft.append(a)
            trl_sft.append(b)
            for name in ("baton", "trl"):
                shutil.rmtree(root / name, ignore_errors=True)
            a, b = dpo_round(files, root, steps, rows, pairs_per_step, pairs)
            ours_dpo.append(a)
            trl_dpo.append(b)
            del round_index
    sft = paired_ratio(ours_sft, trl_sft)
    dpo = paired_ratio(ours_dpo, trl_dpo)
    note = f"{rows} rows of {capacity} tokens per step, bf16 autocast"
    return [
        *out,
        Row("posttrain", "sft step: TRL SFTTrainer", median(trl_sft) * 1e3, "ms/step", note=note),
        Row(
            "posttrain", "sft step: baton fabric", median(ours_sft) * 1e3, "ms/step",
            ratio=sft, baseline="sft step: TRL SFTTrainer", target="<= 1.0", passed=sft <= 1.0,
            note=note,
        ),
        Row(
            "posttrain", "dpo step: TRL DPOTrainer (live reference)", median(trl_dpo) * 1e3,
            "ms/step", note=f"{pairs_per_step} pairs per step, bf16 autocast, its defaults",
        ),
        Row(
            "posttrain", "dpo step: baton fabric (precomputed)", median(ours_dpo) * 1e3,
            "ms/step", ratio=dpo, baseline="dpo step: TRL DPOTrainer (live reference)",
            target="<= 0.7", passed=dpo <= 0.7,
            note=f"{rows} rows per step ({pairs_per_row:.2f} pairs a row), bf16 autocast",
        ),
    ]  # fmt: skip
