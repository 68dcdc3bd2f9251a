"""Extending a run (``--resume auto --allow-changed max_steps``, N -> M steps) means one
thing on every LLM engine: the warmup stays, the cosine decay is stretched to the new
total, and the run continues from the restored step on that curve. The rates logged
after the resume are checked against the formula, written out here on its own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from baton.callbacks.sinks.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
PEAK, FLOOR, WARMUP, FIRST, EXTENDED = 1e-3, 1e-4, 2, 4, 7

#: each engine's recipe and the flags that keep its run tiny
ENGINES = {
    "fabric": ("hf_finetune.py", ["--make-tiny-model", "--batch-size", "2", "--seq-len", "17",
                                  "--eval-every", "0"]),
    "megatron": ("megatron_gpt_tiny.py", ["--batch-size", "2", "--global-batch-size", "2",
                                          "--seq-len", "16", "--eval-every", "0",
                                          "--no-async-save", "--no-progress"]),
    "torchtitan": ("torchtitan_llama3_debug.py", ["--batch-size", "2", "--seq-len", "16",
                                                  "--no-progress"]),
    "maxtext": ("maxtext_tiny.py", ["--batch-size", "2", "--seq-len", "16", "--eval-every",
                                    "0", "--no-async-save", "--no-progress"]),
}  # fmt: skip


def expected_lr(step: int, total: int) -> float:
    """Linear warmup over WARMUP steps from step 1, cosine to FLOOR at step ``total``."""
    if step <= WARMUP:
        return PEAK * step / WARMUP
    progress = min(1.0, (step - WARMUP) / (total - WARMUP))
    return FLOOR + (PEAK - FLOOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


def run(engine: str, run_dir: Path, *args: str) -> dict[int, float]:
    """The engine's recipe in this process; the learning rate it logged at each step."""
    import torch

    from baton.core.cli.recipe import build_driver

    torch.set_num_threads(1)
    recipe, own = ENGINES[engine]
    extra = ["--init-from", str(run_dir.parent / "hf_tiny")] if engine == "fabric" else []
    flags = ["--run-dir", str(run_dir), "--log-every", "1", "--save-every", "0", "--lr",
             str(PEAK), "--min-lr", str(FLOOR), "--warmup-steps", str(WARMUP), *extra, *own]  # fmt: skip
    build_driver(ROOT / "recipes" / recipe, [*flags, *args]).fit()
    rows = read_jsonl(run_dir / "logs" / "metrics.jsonl")
    return {row["step"]: row["lr"] for row in rows if "lr" in row}


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_an_extended_run_continues_on_the_stretched_cosine(engine: str, tmp_path: Path) -> None:
    pytest.importorskip({"fabric": "lightning", "megatron": "megatron.core",
                         "torchtitan": "torchtitan", "maxtext": "maxtext"}[engine])  # fmt: skip
    run_dir = tmp_path / "run"
    first = run(engine, run_dir, "--max-steps", str(FIRST))
    for step in range(1, FIRST + 1):  # the FIRST-step schedule: at the floor at its end
        assert first[step] == pytest.approx(expected_lr(step, FIRST), rel=1e-5), step
    extended = run(
        engine, run_dir, "--max-steps", str(EXTENDED), "--resume", "auto",
        "--allow-changed", "max_steps",
    )  # fmt: skip
    for step in range(FIRST + 1, EXTENDED + 1):  # the EXTENDED-step curve from step FIRST
        assert extended[step] == pytest.approx(expected_lr(step, EXTENDED), rel=1e-5), step
    assert extended[FIRST + 1] > 2 * FLOOR  # back on the curve, not left at the floor
