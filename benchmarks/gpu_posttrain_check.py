"""Post-training on a GPU, checked against references outside baton (not a test: CI has no GPU).

Run from the repository root on a CUDA machine, with the tests' support on the path::

    PYTHONPATH=tests uv run python benchmarks/gpu_posttrain_check.py

It trains one step of SFT on Fabric (``recipes/hf_finetune.py --accelerator cuda``) and on
Megatron-Core (``recipes/megatron_gpt_tiny.py``, which takes the GPU when there is one) from
the same tiny Llama and packed conversations, and compares each first-step loss and
gradient norm with ``transformers`` computing each conversation alone (``sft_reference``);
then one step of DPO on Fabric with the policy as its own reference, whose loss must be
ln 2. Fabric runs its fast paths on the GPU (``--attention auto``: ``flex_attention``
for the packed rows, compiled decoder layers, the fused AdamW); two SFT steps with the
plain paths (``--attention sdpa --compile-layers off --fused-optimizer off``) are
compared with them. Prints one line per check.
"""

from __future__ import annotations

import math
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.data import load_tokenizer
from baton.data.packed import PackedDataset, write_packed
from support.posttrain import (
    _load_hf_tokenizer,
    chat_tokenizer,
    preference_pairs,
    sft_prefix,
    sft_reference,
    tiny_model,
)

ROOT = Path(__file__).resolve().parents[1]


class FirstStep(Callback):
    """The metrics logged at each step (``--log-every 1``)."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, Any]] = {}

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.metrics[driver.step] = dict(metrics)


def first_step(recipe: str, argv: list[str]) -> dict[str, Any]:
    driver = build_driver(ROOT / "recipes" / recipe, argv)
    record = FirstStep()
    driver.callbacks.append(record)
    started = time.time()
    driver.fit()
    print(f"{recipe}: first step {record.metrics[1]} ({time.time() - started:.1f} s)")
    return record.metrics[1]


def steps_metrics(recipe: str, argv: list[str]) -> dict[int, dict[str, Any]]:
    """Every step's logged metrics of a run (``--log-every 1``); the last ``--max-steps``
    given wins over ``common``'s."""
    driver = build_driver(ROOT / "recipes" / recipe, argv)
    assert driver is not None
    record = FirstStep()
    driver.callbacks.append(record)
    driver.fit()
    return record.metrics


def relative(got: float, want: float) -> float:
    return abs(float(got) - want) / abs(want)


def main() -> None:
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    tmp = Path(tempfile.mkdtemp())
    tokenizer = chat_tokenizer(tmp / "tok")
    policy = tiny_model(tmp / "policy")
    sft = sft_prefix(tmp / "data", tokenizer, seq_len=128)
    common = ["--tokenizer", str(tokenizer), "--init-from", str(policy), "--max-steps", "1"]
    common += ["--log-every", "1", "--save-every", "0", "--no-progress"]

    def megatron() -> None:
        flags = ["--seq-len", "128", "--batch-size", "2", "--global-batch-size", "4"]
        flags += ["--no-async-save", "--run-dir", str(tmp / "megatron")]
        got = first_step(
            "megatron_gpt_tiny.py", [*common, *flags, "--objective", "sft", "--data-path", str(sft)]
        )
        loss, grad_norm = sft_reference(policy, sft, rows=[0, 1, 2, 3])
        print(
            f"MEGATRON SFT vs transformers: loss rel {relative(got['loss'], loss):.2e}, "
            f"grad_norm rel {relative(got['grad_norm'], grad_norm):.2e}"
        )

    def fabric() -> None:
        flags = ["--batch-size", "4", "--eval-every", "0", "--accelerator", "cuda"]
        got = first_step(
            "hf_finetune.py",
            [
                *common,
                *flags,
                "--run-dir",
                str(tmp / "fabric"),
                "--objective",
                "sft",
                "--data-path",
                str(sft),
            ],
        )
        from baton.backends.fabric.hf_posttrain import packed_loaders

        train, _ = packed_loaders(PackedDataset(sft), batch_size=4, seed=0, pad_id=0)
        loss, grad_norm = sft_reference(policy, sft, train.order(0)[:4].tolist())
        print(
            f"FABRIC SFT vs transformers: loss rel {relative(got['loss'], loss):.2e}, "
            f"grad_norm rel {relative(got['grad_norm'], grad_norm):.2e}"
        )
        steps = [*flags, "--objective", "sft", "--data-path", str(sft), "--max-steps", "2"]
        plain_paths = ["--attention", "sdpa", "--compile-layers", "off", "--fused-optimizer", "off"]
        fast = steps_metrics("hf_finetune.py", [*common, *steps, "--run-dir", str(tmp / "fast")])
        plain = steps_metrics(
            "hf_finetune.py", [*common, *steps, *plain_paths, "--run-dir", str(tmp / "plain")]
        )
        for step in (1, 2):
            print(
                f"FABRIC SFT step {step}, fast paths vs plain: loss rel "
                f"{relative(fast[step]['loss'], plain[step]['loss']):.2e}, grad_norm rel "
                f"{relative(fast[step]['grad_norm'], plain[step]['grad_norm']):.2e}"
            )
        hf = _load_hf_tokenizer(tokenizer)
        rows = []
        for pair in preference_pairs(12):
            prompt = hf.apply_chat_template(
                pair["prompt"], tokenize=True, add_generation_prompt=True, return_dict=True
            )["input_ids"]
            row = []
            for side in ("chosen", "rejected"):
                ids = hf.apply_chat_template(
                    pair["prompt"] + pair[side], tokenize=True, return_dict=True
                )["input_ids"]
                row.append((list(ids), [0] * len(prompt) + [1] * (len(ids) - len(prompt))))
            rows.append(row)
        width = max(sum(len(ids) for ids, _ in row) for row in rows)
        write_packed(
            tmp / "pairs",
            rows,
            objective="preference",
            seq_len=width,
            tokenizer=load_tokenizer(tokenizer),
        )
        got = first_step(
            "hf_finetune.py",
            [
                *common,
                *flags,
                "--run-dir",
                str(tmp / "dpo"),
                "--objective",
                "dpo",
                "--data-path",
                str(tmp / "pairs"),
            ],
        )
        print(f"FABRIC DPO at equal weights minus ln 2: {got['loss'] - math.log(2):.2e}")

    for check in (megatron, fabric):
        try:
            check()
        except Exception:
            traceback.print_exc()


if __name__ == "__main__":  # Megatron's checkpoint writer spawns processes that import __main__
    main()
