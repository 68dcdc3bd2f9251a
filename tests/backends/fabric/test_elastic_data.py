"""Prepared data on the Fabric backend resumed on another number of ranks: 2 ranks, then
1 (a lost node), then 2 again, each attempt resuming the previous one's checkpoint, read
every sample of the epoch exactly once; a loader whose position is per rank is refused on
another number of ranks, naming both."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from support.processes import run_job
from support.torchrun import torchrun

WORKER = Path(__file__).with_name("elastic_worker.py")
BATCH = 4
TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--seq-len", "32"]
TINY += ["--batch-size", str(BATCH), "--log-every", "1", "--eval-every", "0"]
TINY += ["--save-every", "1000", "--no-progress", "--max-steps", "1000"]


def prepared(root: Path) -> list[str]:
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    train_tokenizer(root / "tok", vocab_size=300)
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in reference_documents()[:6]))
    prepare([docs], root / "tok", root / "corpus", workers=1)
    return ["--data-path", str(root / "corpus"), "--tokenizer", str(root / "tok")]


def one_rank(out: Path, stop_at: int, args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_job([sys.executable, str(WORKER), str(out), str(stop_at), *args], env, 300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def reads(out: Path, ranks: int) -> list[list[list[int]]]:
    return [json.loads(Path(f"{out}.rank{r}").read_text())["read"] for r in range(ranks)]


@pytest.mark.slow
def test_two_one_two_ranks_read_each_sample_of_the_epoch_once(tmp_path: Path) -> None:
    from baton.backends.fabric.text import text_loaders

    data = prepared(tmp_path)
    samples = len(text_loaders(data[1], data[3], seq_len=32, batch_size=BATCH)[0].dataset)
    args = [*data, *TINY, "--run-dir", str(tmp_path / "run")]
    # 2 ranks x 3 steps, 1 rank x k steps, then 2 ranks to one step into the next epoch:
    # k makes what is left a whole number of 2-rank batches (only the last samples % BATCH
    # of the order, a tail no layout reads, are left out of the epoch)
    k = 1 if (samples // BATCH) % 2 else 2
    first, second = 3, 3 + k
    left = samples - 2 * BATCH * first - BATCH * k
    last = second + left // (2 * BATCH) + 1
    torchrun(WORKER, str(tmp_path / "a"), str(first), *args, timeout=300)
    one_rank(tmp_path / "b", second, args)
    torchrun(WORKER, str(tmp_path / "c"), str(last), *args, timeout=300)

    a, (b,), c = reads(tmp_path / "a", 2), reads(tmp_path / "b", 1), reads(tmp_path / "c", 2)
    assert [len(r) for r in a] == [BATCH * first] * 2 and len(b) == BATCH * k
    epoch0 = [i for rank in (*a, b, *c) for e, i in rank if e == 0]
    counts = Counter(epoch0)
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]
    assert len(epoch0) == samples - samples % BATCH and set(epoch0) <= set(range(samples))
    # the last step read the first global batch of the next epoch, half on each rank
    assert [sum(1 for e, _ in rank if e == 1) for rank in c] == [BATCH, BATCH]


def test_a_per_rank_position_is_refused_on_another_number_of_ranks() -> None:
    from baton.backends.fabric.stream import LoaderStream
    from baton.core.errors import UsageError

    saved = LoaderStream([1, 2, 3], world_size=2)
    saved.next()
    resumed = LoaderStream([1, 2, 3], world_size=1)
    with pytest.raises(UsageError, match=r"2 rank\(s\), this run has 1.*GlobalBatches"):
        resumed.load_state_dict(saved.state_dict())
