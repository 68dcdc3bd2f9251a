"""Megatron-Core on prepared data resumed on another data-parallel size: data parallel
2, then 1 (a lost node), then 2 again, each attempt resuming the previous one's
checkpoint, read every training sample exactly once, in Megatron's global order."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support.processes import run_job
from support.torchrun import torchrun

pytest.importorskip("megatron.core")

WORKER = Path(__file__).with_name("elastic_worker.py")
GLOBAL_BATCH = 8


def prepared(root: Path) -> tuple[str, str]:
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    train_tokenizer(root / "tok", vocab_size=300)
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in reference_documents()[:30]))
    prepare([docs], root / "tok", root / "corpus", workers=1)
    return str(root / "corpus"), str(root / "tok")


@pytest.mark.slow
def test_data_parallel_two_one_two_reads_each_sample_once(tmp_path: Path) -> None:
    prefix, tokenizer = prepared(tmp_path)
    stops = (2, 4, 6)  # steps; every attempt ends with a checkpoint the next one resumes
    samples = stops[-1] * GLOBAL_BATCH
    args = [str(tmp_path / "run"), prefix, tokenizer, str(samples)]
    torchrun(WORKER, str(tmp_path / "a"), str(stops[0]), *args, timeout=400)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_job(
        [sys.executable, str(WORKER), str(tmp_path / "b"), str(stops[1]), *args], env, 400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    torchrun(WORKER, str(tmp_path / "c"), str(stops[2]), *args, timeout=400)

    def read(name: str, rank: int) -> list[int]:
        return json.loads((tmp_path / f"{name}.rank{rank}").read_text())

    a0, a1, b, c0, c1 = read("a", 0), read("a", 1), read("b", 0), read("c", 0), read("c", 1)
    # each attempt reads exactly its steps' global batches: consecutive global samples
    assert sorted(a0 + a1) == list(range(0, 16))
    assert b == list(range(16, 32))
    assert sorted(c0 + c1) == list(range(32, 48))
    # data parallel 2: each micro-batch round, rank 0 the first 2 samples, rank 1 the next
    assert a0 == [0, 1, 4, 5, 8, 9, 12, 13] and c1[:2] == [34, 35]
