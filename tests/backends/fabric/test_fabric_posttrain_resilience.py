"""SFT and DPO runs on the Fabric backend (recipes/hf_finetune.py) keep what pretraining
runs have: a rollback to an earlier checkpoint replays the same losses bit for bit (DPO's
reference log-probabilities included), Freeze leaves its parameters as loaded while the
others train, EMA's averages are the weights' average, and a run resumed on fewer
data-parallel ranks reads every packed row of the epoch once (a DPO pair always whole on
one rank)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from baton.callbacks import EMA, Freeze, LossGuard
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.data.packed import PackedDataset
from support.posttrain import posttrain_files, sft_reference
from support.resilience import (
    LoggedMetrics,
    RollbackOnce,
    StepWeights,
    check_ema,
    check_frozen,
    check_replayed,
)

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
RECIPE = ROOT / "recipes" / "hf_finetune.py"
SEQ_LEN = 96
FROZEN = ["model.layers.0.*"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("posttrain_resilience"), SEQ_LEN, 24)


def objective_args(files: dict[str, Path], objective: str) -> list[str]:
    args = ["--objective", objective, "--init-from", str(files["policy"])]
    args += ["--tokenizer", str(files["tokenizer"]), "--eval-every", "0", "--no-progress"]
    if objective == "sft":
        return [*args, "--data-path", str(files["sft"])]
    return [*args, "--data-path", str(files["pairs"]), "--reference", str(files["reference"])]


def fit(files, run_dir: Path, objective: str, callbacks: list, *extra: str):
    args = objective_args(files, objective)
    args += ["--batch-size", "2", "--log-every", "1", "--run-dir", str(run_dir), *extra]
    driver = build_driver(RECIPE, args)
    driver.callbacks += callbacks
    driver.fit()
    return driver


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_a_rollback_replays_the_uninterrupted_losses_bitwise(files, tmp_path, objective):
    """Checkpoints at steps 2 and 4; at step 5's start the run goes back to step 2 and
    trains steps 3-6 again: every logged value, the DPO rewards (policy minus the stored
    reference log-probabilities) included, and the last weights equal the run that never
    went back."""
    straight, straight_weights = LoggedMetrics(), StepWeights()
    fit(files, tmp_path / "straight", objective, [straight, straight_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    replayed, replayed_weights = LoggedMetrics(), StepWeights()
    rollback = RollbackOnce(at_step=5, to_step=2)
    fit(files, tmp_path / "rollback", objective, [rollback, replayed, replayed_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    assert rollback.done
    keys = ["loss", "grad_norm"]
    if objective == "dpo":
        keys += ["rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"]
    check_replayed(straight, replayed, straight_weights, replayed_weights, keys)


class NaNLogitsAt(Callback):
    """Step ``at`` (once) computes NaN logits: its loss, gradients and weights break."""

    def __init__(self, at: int) -> None:
        self.at, self.hook = at, None

    def on_step_start(self, driver) -> None:
        if driver.step + 1 == self.at and self.hook is None:
            head = driver.backend.raw_model.lm_head
            self.hook = head.register_forward_hook(lambda _m, _i, out: out * float("nan"))

    def on_step_end(self, driver, output) -> None:
        if self.hook is not None and driver.step == self.at:
            self.hook.remove()


class SkipAt(Callback):
    """Skip one step's data at step ``at``'s start (once), as a rollback over it does."""

    def __init__(self, at: int) -> None:
        self.at, self.done = at, False

    def on_step_start(self, driver) -> None:
        if driver.step + 1 == self.at and not self.done:
            self.done = True
            driver.backend.skip_data(1)


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_loss_guard_rolls_back_a_nan_and_skips_its_rows(files, tmp_path, objective):
    """Step 5's logits are NaN: LossGuard refuses its save, goes back to the step-4
    checkpoint and skips step 5's rows; steps 5-6 then equal, bit for bit, a run that
    was never broken and skipped those rows at step 5 (DPO: with the same rewards
    against the stored reference log-probabilities)."""
    skipped, skipped_weights = LoggedMetrics(), StepWeights()
    fit(files, tmp_path / "skipped", objective, [SkipAt(5), skipped, skipped_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    guard, guarded, guarded_weights = LossGuard(action="rollback"), LoggedMetrics(), StepWeights()
    fit(files, tmp_path / "guarded", objective, [NaNLogitsAt(5), guard, guarded, guarded_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    assert guard.rollbacks == 1
    assert [step for step, _ in guarded.logged] == [1, 2, 3, 4, 5, 5, 6]
    assert math.isnan(guarded.logged[4][1]["loss"])
    keys = ["loss", "grad_norm"]
    if objective == "dpo":
        keys += ["rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"]
    want, got = skipped.metrics, guarded.metrics
    for step in range(1, 7):
        assert [got[step][k] for k in keys] == [want[step][k] for k in keys], step
    for name, value in skipped_weights.values[6].items():
        assert np.array_equal(guarded_weights.values[6][name], value), name
    names = sorted(p.name for p in (tmp_path / "guarded" / "checkpoints").glob("step_*"))
    assert names == ["step_000004", "step_000006"]  # keep_last=2; no save of step 5


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_freeze_and_ema_on_post_training(files, tmp_path, objective):
    """Layer 0 frozen for the whole run: its weights never move while every other
    parameter changes at every step; EMA(0.5)'s averages equal the weights' average
    computed here. The first step, frozen or not, computes the reference loss."""
    weights, metrics, ema = StepWeights(), LoggedMetrics(), EMA(decay=0.5)
    fit(files, tmp_path / "run", objective, [Freeze(FROZEN), ema, weights, metrics],
        "--max-steps", "3", "--save-every", "0")  # fmt: skip
    frozen = check_frozen(weights, FROZEN)
    assert metrics.metrics[1]["freeze/frozen"] == len(frozen)
    check_ema(weights, ema.averages, decay=0.5)
    if objective == "sft":
        from baton.backends.fabric.hf_posttrain import packed_loaders

        train, _ = packed_loaders(PackedDataset(files["sft"]), batch_size=2, seed=0, pad_id=0)
        loss, _ = sft_reference(files["policy"], files["sft"], train.order(0)[:2].tolist())
        assert metrics.metrics[1]["loss"] == pytest.approx(loss, rel=1e-5)


ELASTIC_WORKER = HERE / "elastic_worker.py"


def elastic_attempt(out: Path, stop_at: int, args: list[str], ranks: int) -> list[list[list[int]]]:
    """One attempt of the run (resuming its last checkpoint) on ``ranks`` ranks, stopped
    and saved at step ``stop_at``: the ``[epoch, row]`` each rank read, in order."""
    from support.processes import run_job
    from support.torchrun import torchrun

    worker_args = [str(out), str(stop_at), "--recipe", str(RECIPE), *args]
    if ranks == 1:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = run_job([sys.executable, str(ELASTIC_WORKER), *worker_args], env, 300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    else:
        torchrun(ELASTIC_WORKER, *worker_args, nproc=ranks, timeout=300)
    return [json.loads(Path(f"{out}.rank{r}").read_text())["read"] for r in range(ranks)]


@pytest.mark.slow
def test_sft_resumed_on_fewer_ranks_reads_every_row_once(files, tmp_path):
    """2 ranks for 2 steps, then 1 rank (a lost node) to the end of the epoch and one
    step into the next: each packed row of epoch 0 is read once (none twice, none
    skipped but the tail shorter than a global batch)."""
    batch = 2
    args = [*objective_args(files, "sft"), "--batch-size", str(batch), "--log-every", "1"]
    args += ["--save-every", "1000", "--max-steps", "1000", "--run-dir", str(tmp_path / "run")]
    a = elastic_attempt(tmp_path / "a", 2, args, ranks=2)
    samples = json.loads((tmp_path / "a.rank0").read_text())["samples"]
    left = samples - 2 * (2 * batch)
    (b,) = elastic_attempt(tmp_path / "b", 2 + left // batch + 1, args, ranks=1)

    assert [len(r) for r in a] == [2 * batch] * 2
    epoch0 = [row for rank in (*a, b) for epoch, row in rank if epoch == 0]
    counts = Counter(epoch0)
    assert max(counts.values()) == 1, [row for row, n in counts.items() if n > 1]
    # only the tail shorter than a batch of the one rank is left unread
    assert len(epoch0) == samples - left % batch and set(epoch0) <= set(range(samples))
    assert sum(1 for e, _ in b if e == 1) == batch  # the next epoch's first batch


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_dpo_pairs_stay_whole_on_one_rank_whatever_the_ranks(files, world_size):
    """The recipe's DPO batches cut among ``world_size`` ranks: every pair of the
    training rows (documents 2k and 2k+1 of the data) is read in one epoch by exactly one
    rank, both its documents in the same row of that rank's batch, chosen first."""
    from baton.backends.fabric.hf_posttrain import packed_loaders

    data = PackedDataset(files["pairs"])
    reference = np.zeros(data.num_sequences)
    train, _ = packed_loaders(data, batch_size=2, seed=0, pad_id=0, reference=reference)
    seen: Counter[int] = Counter()
    for rank in range(world_size):
        for batch in train.shard(rank, world_size):
            for documents in batch["documents"].numpy():
                documents = documents[documents >= 0]
                chosen, rejected = documents[0::2], documents[1::2]
                assert len(documents) % 2 == 0 and len(documents) > 0, documents
                assert (chosen % 2 == 0).all() and (rejected == chosen + 1).all(), documents
                seen.update(chosen.tolist())
    assert max(seen.values()) == 1
    read_rows = (train.samples // (2 * world_size)) * 2 * world_size
    assert len(seen) == sum(len(data.row(r)) // 2 for r in train.order(0)[:read_rows].tolist())


#: what a DPO step logs that training decides (not its times)
TRAINED = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins",
           "rewards/accuracies", "logps/chosen", "logps/rejected")  # fmt: skip


@pytest.mark.slow
def test_dpo_rolled_back_under_ddp_replays_bitwise(files, tmp_path):
    """Two DDP ranks, checkpoints every 2 steps; at step 5 the run goes back to step 2:
    on both ranks the replayed steps log the losses and TRL's metrics of a straight run
    bit for bit (each rank's pairs and stored reference log-probabilities read again),
    and both end on its weights."""
    from support.torchrun import torchrun

    worker = HERE / "posttrain_rollback_worker.py"
    args = [*objective_args(files, "dpo"), "--batch-size", "2", "--log-every", "1"]
    args += ["--max-steps", "6", "--save-every", "2"]
    for mode in ("straight", "rollback"):
        run_args = [*args, "--run-dir", str(tmp_path / mode)]
        torchrun(worker, str(tmp_path / "out"), mode, *run_args, nproc=2, timeout=300)
    for rank in (0, 1):
        straight, replayed = (
            json.loads((tmp_path / f"out.{mode}.rank{rank}.json").read_text())
            for mode in ("straight", "rollback")
        )
        assert [step for step, _ in replayed["logged"]] == [1, 2, 3, 4, 3, 4, 5, 6]
        want, got = (
            [(step, {k: v for k, v in m.items() if k in TRAINED}) for step, m in run["logged"]]
            for run in (straight, replayed)
        )
        assert len(want[0][1]) == len(TRAINED), want[0]
        assert dict(got) == dict(want)
        assert got[2:4] == got[4:6]  # the replay itself
        assert replayed["weights"] == straight["weights"]
