"""``baton compare``: the four backends on one tokenizer and one prepared
dataset, four steps each in their own processes, and the loss chart over all of them."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.data import PreparedDataset, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("fabric", "torchtitan", "megatron", "maxtext")
STEPS = 4


@pytest.mark.slow
def test_compare_backends_trains_all_four_on_the_same_tokens(tmp_path: Path) -> None:
    run_dir = tmp_path / "compare"
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
    command = [
        sys.executable, "-m", "baton.core.cli", "compare", f"--recipes={ROOT / 'recipes'}",
        f"--steps={STEPS}", "--layers=2", "--hidden=64", "--heads=4", "--seq-len=32",
        "--batch=2", f"--run-dir={run_dir}",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    logs = {b: (run_dir / f"{b}.log") for b in BACKENDS}
    tails = "\n".join(
        f"--- {b}\n" + "\n".join(p.read_text().splitlines()[-15:])
        for b, p in logs.items()
        if p.is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails

    tokenizer = load_tokenizer(run_dir / "data" / "tokenizer")  # trained by the recipe
    data = PreparedDataset(str(run_dir / "data" / "reference"))  # prepared once with it
    data.check_tokenizer(tokenizer)
    finals = {}
    for backend in BACKENDS:
        records = read_jsonl(run_dir / backend / "logs" / "metrics.jsonl")
        losses = [r["loss"] for r in records if "loss" in r]
        assert [r["step"] for r in records if "loss" in r] == list(range(1, STEPS + 1)), backend
        assert all(math.isfinite(v) for v in losses), (backend, losses)
        # every backend starts near ln(vocabulary): the same tokens, untrained models
        assert abs(losses[0] - math.log(tokenizer.vocab_size)) < 1.0, (backend, losses[0])
        finals[backend] = losses[-1]
        # each ran on the prepared data and the tokenizer given to it
        command_line = logs[backend].read_text().splitlines()[0]
        assert f"--data-path={run_dir / 'data' / 'reference'}" in command_line
        assert f"--tokenizer={run_dir / 'data' / 'tokenizer'}" in command_line

    chart = run_dir / "comparison" / "loss.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for backend, final in finals.items():  # the table of final losses
        assert backend in result.stdout and f"{final:.4f}" in result.stdout
