"""Online RL (GRPO) against TRL, and where each engine's GRPO step spends its time.

* **grpo_step**: time per optimizer step of ``recipes/hf_finetune.py --objective grpo``
  (Fabric: the rollout phase samples with a ``transformers`` model holding the policy's
  weights, loaded when they changed, then Fabric's step trains on the rollouts) and of
  TRL's ``GRPOTrainer`` (``transformers`` generation on the training model), on the same
  Llama, the same prompts, the same number of prompts and completions per step, the same
  completion length and sampling settings, the same reward function. Each side's step
  includes its sampling, scoring and training. Target: <= 1.0.
* **grpo_split**: the mean of each engine's ``timing/generation_s``,
  ``timing/weight_sync_s`` and ``timing/train_s`` over a run of GRPO steps (Fabric,
  TorchTitan, Megatron-Core and MaxText, each in its own process, on the same model,
  prompts and settings; ``--quick``: Fabric alone), the first two steps left out. No
  target: where the time goes.

Each round of ``grpo_step`` builds both runs afresh and times their steps after the first
two; the ratio is the median over rounds of the paired medians.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Row, median, paired_ratio
from benchmarks.posttrain import StepTimes, _baton_callback, _trl_callback

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
#: the recipe each engine's split runs, and what it needs beyond the shared flags
ENGINES: dict[str, tuple[str, list[str]]] = {
    "fabric": ("hf_finetune.py", []),
    "torchtitan": ("torchtitan_llama3_debug.py", []),
    "megatron": ("megatron_gpt_tiny.py", ["--global-batch-size", "{rows}"]),
    "maxtext": ("maxtext_tiny.py", []),
}
#: the reward every side scores with (TRL's signature)
REWARD = ROOT / "tests" / "support" / "grpo_rewards.py"


def vowel_start(prompts: Any, completions: Any, completion_ids: Any, **columns: Any) -> list:
    """The fraction of a completion's words that start with a vowel (as the test task)."""
    out = []
    for completion in completions:
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        words = text.split()
        out.append(sum(w[0].lower() in "aeiou" for w in words) / len(words) if words else 0.0)
    return out


def make_files(root: Path, quick: bool) -> dict[str, Any]:
    """A chat tokenizer, a Llama for it (wider outside ``quick``), prompts in TRL's format
    and prepared by ``baton data prepare``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from baton.tools.data.cli import main
    from support.grpo import grpo_prompts
    from support.posttrain import chat_tokenizer
    from support.tiny_llama import save_tiny_llama

    tokenizer = chat_tokenizer(root / "tok")
    hidden = 64 if quick else 256
    save_tiny_llama(root / "model", vocab_size=512, seed=0, hidden_size=hidden,
                    intermediate_size=hidden * 11 // 4)  # fmt: skip
    prompts = grpo_prompts(64, seed=3)
    source = root / "prompts.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    status = main(["prepare", str(source), "--tokenizer", str(tokenizer),
                   "--output", str(root / "prompts")])  # fmt: skip
    if status != 0:
        raise RuntimeError("baton data prepare failed")
    return {"tok": tokenizer, "model": root / "model", "prompts": prompts,
            "prepared": root / "prompts"}  # fmt: skip


def grpo_flags(files: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The GRPO flags every baton side runs with."""
    return [
        "--objective", "grpo", "--init-from", str(files["model"]),
        "--data-path", str(files["prepared"]), "--tokenizer", str(files["tok"]),
        "--reward", f"{REWARD}:vowel_start",
        "--num-generations", str(settings["generations"]),
        "--max-completion-length", str(settings["completion"]),
        # rows hold the longest prompt (28 tokens) and the longest completion
        "--seq-len", str(32 + settings["completion"]),
        "--batch-size", str(settings["rows"]), "--lr", "1e-3",
    ]  # fmt: skip


def baton_round(files: dict[str, Any], root: Path, settings: dict[str, Any]) -> StepTimes:
    from baton.core.cli.recipe import build_driver

    times = StepTimes()
    driver = build_driver(
        RECIPES / "hf_finetune.py",
        [*grpo_flags(files, settings), "--max-steps", str(settings["steps"]),
         "--log-every", "10", "--save-every", "0", "--no-progress",
         "--run-dir", str(root / "baton")],
    )  # fmt: skip
    assert driver is not None
    driver.callbacks = [c for c in driver.callbacks if type(c).__name__ != "Checkpoint"]
    driver.callbacks.append(_baton_callback(times))
    driver.fit()
    return times


def trl_round(files: dict[str, Any], root: Path, settings: dict[str, Any]) -> StepTimes:
    import datasets
    import transformers
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    times = StepTimes()
    args = GRPOConfig(
        output_dir=str(root / "trl"), max_steps=settings["steps"],
        per_device_train_batch_size=settings["rows"],
        num_generations=settings["generations"],
        max_completion_length=settings["completion"], temperature=1.0, top_k=0,
        learning_rate=1e-3, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        report_to="none", use_cpu=True, logging_steps=10, save_strategy="no",
        dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(files["model"]),
        reward_funcs=[vowel_start],
        args=args,
        train_dataset=datasets.Dataset.from_list(files["prompts"]),
        processing_class=transformers.AutoTokenizer.from_pretrained(files["tok"]),
        callbacks=[_trl_callback(times)],
    )
    trainer.train()
    return times


def split_rows(
    files: dict[str, Any], root: Path, settings: dict[str, Any], engines: tuple[str, ...]
) -> list[Row]:
    """Each engine's mean generation, weight-sync and training seconds per step."""
    rows: list[Row] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT / "tests")}  # fmt: skip
    for engine in engines:
        recipe, extra = ENGINES[engine]
        run_dir = root / f"split-{engine}"
        command = [
            sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPES / recipe),
            *grpo_flags(files, settings),
            *[flag.format(rows=settings["rows"]) for flag in extra],
            "--max-steps", str(settings["split_steps"]), "--log-every", "1",
            "--save-every", "0", "--no-progress", "--run-dir", str(run_dir),
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=root)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            rows.append(Row("grpo", f"split: {engine}", None, "", passed=False,
                            note=f"failed: {tail[0] if tail else done.returncode}"))  # fmt: skip
            continue
        logged = [
            json.loads(line)
            for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
        steps = [r for r in logged if "timing/train_s" in r][2:]
        for key in ("generation_s", "weight_sync_s", "train_s"):
            value = statistics.mean(r[f"timing/{key}"] for r in steps) * 1e3
            rows.append(Row("grpo", f"split: {engine} {key[:-2]}", value, "ms/step",
                            note=f"mean over steps 3-{settings['split_steps']}"))  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    import transformers

    transformers.logging.set_verbosity_error()
    rounds = 1 if quick else 3
    settings = {
        "rows": 16, "generations": 8, "completion": 16 if quick else 48,
        "steps": 4 if quick else 8, "split_steps": 5 if quick else 10,
    }  # fmt: skip
    scratch = os.environ.get("BATON_BENCH_SCRATCH")
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        root = Path(tmp)
        files = make_files(root, quick)
        ours, theirs = [], []
        for _ in range(rounds):
            for name in ("baton", "trl"):
                shutil.rmtree(root / name, ignore_errors=True)
            ours.append(baton_round(files, root, settings).per_step())
            theirs.append(trl_round(files, root, settings).per_step())
        # a smoke run splits Fabric's step only (the others start in tens of seconds)
        split = split_rows(files, root, settings, ("fabric",) if quick else tuple(ENGINES))
    ratio = paired_ratio(ours, theirs)
    note = (
        f"{settings['rows'] // settings['generations']} prompts x {settings['generations']} "
        f"completions of up to {settings['completion']} tokens per step"
    )
    return [
        Row("grpo", "grpo step: TRL GRPOTrainer", median(theirs) * 1e3, "ms/step", note=note),
        Row(
            "grpo", "grpo step: baton fabric", median(ours) * 1e3, "ms/step", ratio=ratio,
            baseline="grpo step: TRL GRPOTrainer", target="<= 1.0", passed=ratio <= 1.0,
            note=note,
        ),
        *split,
    ]  # fmt: skip
