"""A batch larger than the data is refused on TorchTitan in one line, as on the other
engines, instead of putting the same rows into one step several times: packed
post-training rows and a prepared pretraining dataset's windows, from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from support.posttrain import posttrain_files

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "recipes" / "torchtitan_llama3_debug.py"
ENV = {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
SEQ = 96


def baton(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", *args],
        capture_output=True, text=True, timeout=600, env=os.environ | ENV, cwd=ROOT,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("baton:")]
    assert result.returncode == 2 and len(lines) == 1, result.stdout[-2000:] + result.stderr
    return lines[0]


def test_more_packed_rows_a_step_than_the_data_holds_are_refused(tmp_path):
    files = posttrain_files(tmp_path, SEQ, num_rows=8, kinds=("sft",))
    result = baton(
        "run", str(RECIPE), "--objective", "sft", "--data-path", str(files["sft"]),
        "--tokenizer", str(files["tokenizer"]), "--init-from", str(files["policy"]),
        "--seq-len", str(SEQ), "--batch-size", "16", "--max-steps", "1", "--no-progress",
        "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    line = one_error_line(result)
    assert f"{files['sft']}: 8 rows, fewer than one batch across data-parallel ranks (16 x 1)" in (
        line
    )
    assert "use a smaller --batch-size or prepare more data" in line


def test_more_windows_a_step_than_a_prepared_dataset_holds_are_refused(tmp_path):
    from baton.data import train_tokenizer
    from baton.tools.data.prepare import prepare

    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=300)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i} of a short text"}) + "\n"
                              for i in range(40)))  # fmt: skip
    prepare([corpus], tokenizer, tmp_path / "corpus", workers=1)
    result = baton(
        "run", str(RECIPE), "--data-path", str(tmp_path / "corpus"), "--tokenizer",
        str(tokenizer.path), "--seq-len", "64", "--batch-size", "64", "--max-steps", "1",
        "--no-progress", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    line = one_error_line(result)
    assert "windows of 64, fewer than one batch across data-parallel ranks (64 x 1)" in line
    assert "use a smaller --batch-size or prepare more data or lower training.seq_len" in line
