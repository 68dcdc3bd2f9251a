"""MaxText on baton's byte stream resumed on another number of JAX processes: 2
processes, then 1 (a lost host), then 2 again, each attempt resuming the previous one's
checkpoint with the global batch of its own size, read every window of the epoch once."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from support.processes import baton_rank_envs, run_job, run_together

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parent / "elastic_run.py"
PER_DEVICE, SEQ = 2, 32
ARGS = [f"--batch-size={PER_DEVICE}", f"--seq-len={SEQ}", "--layers=1"]
ARGS += ["--d-model=32", "--heads=2", "--max-steps=100", "--log-every=1", "--eval-every=0"]
ARGS += ["--save-every=1000", "--no-progress", "--no-print-loss"]


def two(out: Path, stop_at: int, args: list[str]) -> None:
    command = [sys.executable, str(WORKER), str(out), str(stop_at), *args]
    envs = [{k: v for k, v in env.items() if k != "XLA_FLAGS"} for env in baton_rank_envs(2)]
    run_together([command, command], envs, timeout=600)


def one(out: Path, stop_at: int, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"OMP_NUM_THREADS": "1"}
    done = run_job([sys.executable, str(WORKER), str(out), str(stop_at), *args], env, 600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def report(out: Path, rank: int) -> dict[str, object]:
    return json.loads(Path(f"{out}.rank{rank}").read_text())


def test_two_one_two_processes_read_each_window_of_the_epoch_once(tmp_path: Path) -> None:
    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus
    from baton.data.corpus import reference_documents

    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(reference_documents())[:3000])
    windows = TextBatches(
        TextCorpus.load(text).train, batch_size=PER_DEVICE, seq_len=SEQ
    ).num_windows
    args = [*ARGS, f"--data-path={text}", f"--run-dir={tmp_path / 'run'}"]
    # global batch 4 on two processes, 2 on one: k one-process steps leave a whole number
    # of two-process batches (only a tail of windows % 2, which no layout reads, is left)
    k = 1 if (windows // PER_DEVICE) % 2 else 2
    first, second = 2, 2 + k
    last = second + (windows - 4 * first - 2 * k) // 4 + 1
    two(tmp_path / "a", first, args)
    one(tmp_path / "b", second, args)
    two(tmp_path / "c", last, args)

    a, b, c = report(tmp_path / "a", 0), report(tmp_path / "b", 0), report(tmp_path / "c", 0)
    assert (a["global_batch"], b["global_batch"], c["global_batch"]) == (4, 2, 4)
    for name in ("a", "c"):  # every process builds the same global batch
        assert report(tmp_path / name, 1)["windows"] == report(tmp_path / name, 0)["windows"]
    read: list[int] = [*a["windows"], *b["windows"], *c["windows"]]  # type: ignore[misc]
    assert len(read) == 4 * first + 2 * k + 4 * (last - second)
    epoch0 = read[:-4]  # the last step read the next epoch's first global batch
    counts = Counter(epoch0)
    assert max(counts.values()) == 1 and len(epoch0) == windows - windows % 2
    assert set(epoch0) <= set(range(windows))
