"""A Megatron-Core SFT run resumed on fewer data-parallel ranks (2, then 1: a lost node)
reads the packed rows in Megatron's global order: each row once, none skipped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from support.posttrain import chat_tokenizer, sft_prefix, tiny_model
from support.processes import run_job
from support.torchrun import torchrun

WORKER = Path(__file__).with_name("posttrain_elastic_worker.py")
SEQ_LEN, GLOBAL_BATCH = 128, 4


@pytest.mark.slow
def test_sft_on_two_ranks_then_one_reads_each_row_once(tmp_path: Path) -> None:
    tokenizer = chat_tokenizer(tmp_path / "tok")
    args = [
        "--objective", "sft", "--init-from", str(tiny_model(tmp_path / "model")),
        "--data-path", str(sft_prefix(tmp_path / "data", tokenizer, SEQ_LEN, num_rows=16)),
        "--tokenizer", str(tokenizer), "--seq-len", str(SEQ_LEN), "--batch-size", "2",
        "--global-batch-size", str(GLOBAL_BATCH), "--max-steps", "100", "--log-every", "1",
        "--save-every", "0", "--no-async-save", "--no-progress",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    torchrun(WORKER, str(tmp_path / "a"), "2", *args, timeout=400)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_job([sys.executable, str(WORKER), str(tmp_path / "b"), "4", *args], env, 400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    def read(name: str) -> list[int]:
        return json.loads((tmp_path / name).read_text())

    a0, a1, b = read("a.rank0"), read("a.rank1"), read("b.rank0")
    # steps 1-2 on two ranks, each a micro-batch of 2 rows a step; steps 3-4 on one rank
    assert len(a0) == len(a1) == 2 * GLOBAL_BATCH // 2 and len(b) == 2 * GLOBAL_BATCH
    assert not set(a0) & set(a1)
    assert sorted(a0 + a1) == list(range(2 * GLOBAL_BATCH))
    assert b == list(range(2 * GLOBAL_BATCH, 4 * GLOBAL_BATCH))
