"""DPO on TorchTitan: packed preference pairs, DPO's declared loss as TorchTitan's loss
function (``objective_loss.ObjectiveLoss``) inside ``Trainer.train_step``, the reference
log-probabilities computed once by TorchTitan before the first step and kept beside the
data.

The first step's loss and TRL's metrics equal TRL's ``DPOTrainer`` on the same policy,
reference (another model: at equal weights every DPO loss is ln 2) and pairs
(``support.posttrain.dpo_reference``), in fp32 on CPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")

from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.posttrain import (
    DPO_METRICS,
    LoggedMetrics,
    dpo_reference,
    posttrain_files,
    sft_prefix,
    tiny_model,
)

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH = 96, 2


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("titan_dpo")
    return {"root": root, **posttrain_files(root, SEQ, kinds=("pairs",))}


def dpo_run(assets: dict[str, Path], run_dir: Path, *extra: str) -> dict[str, float]:
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, [
        "--objective", "dpo", "--data-path", str(assets["pairs"]),
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--reference", str(assets["reference"]), "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--max-steps", "1", "--log-every", "1",
        "--save-every", "0", "--run-dir", str(run_dir), "--no-progress", *extra,
    ])  # fmt: skip
    driver.callbacks.append(logged)
    driver.fit()
    return logged.metrics[1]


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_first_dpo_step_equals_trl(assets, loss_type, tmp_path):
    first = dpo_run(assets, tmp_path / "run", "--dpo-loss", loss_type, "--dpo-beta", "0.1")
    trl = dpo_reference(
        assets["policy"], assets["reference"], assets["pairs"], rows=range(BATCH),
        beta=0.1, loss_type=loss_type,
    )  # fmt: skip
    assert trl["loss"] != pytest.approx(math.log(2), rel=1e-3)  # the reference differs
    assert first["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    for name in DPO_METRICS:  # a reward is beta x a difference of two float32 sums near
        # -100 (summed in another order by TRL): 1e-5 of those sums, absolutely
        assert first[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-5), name


def test_reference_logps_are_stored_beside_the_data_and_reused(assets, tmp_path):
    import json

    import numpy as np

    from baton.backends.reference_logps import model_fingerprint
    from baton.data.packed import PackedDataset

    stored = sorted(assets["pairs"].parent.glob("pairs.reference-*.npy"))
    if not stored:
        dpo_run(assets, tmp_path / "first")
        stored = sorted(assets["pairs"].parent.glob("pairs.reference-*.npy"))
    assert len(stored) == 1
    record = json.loads(stored[0].with_suffix(".json").read_text())
    fingerprint = model_fingerprint(assets["reference"])
    assert record["engine"] == "torchtitan"
    assert record["reference"]["fingerprint"] == fingerprint
    assert stored[0].name == f"pairs.reference-{fingerprint[:16]}.npy"
    logps = np.load(stored[0])
    assert logps.shape == (PackedDataset(assets["pairs"]).num_sequences,) and (logps < 0).all()
    before = stored[0].stat().st_mtime_ns
    dpo_run(assets, tmp_path / "again")
    assert stored[0].stat().st_mtime_ns == before  # read, not computed again
    # the starting weights as reference: another fingerprint, another file
    logged = LoggedMetrics()
    driver = build_driver(RECIPE, [
        "--objective", "dpo", "--data-path", str(assets["pairs"]),
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--max-steps", "1",
        "--log-every", "1", "--save-every", "0", "--run-dir", str(tmp_path / "self"),
        "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(logged)
    driver.fit()
    assert logged.metrics[1]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert len(list(assets["pairs"].parent.glob("pairs.reference-*.npy"))) == 2


def test_sft_data_in_a_dpo_run_is_refused_before_the_build(assets, tmp_path):
    conversations = sft_prefix(tmp_path / "sft", assets["tokenizer"], seq_len=SEQ)
    with pytest.raises(UsageError, match="--objective sft"):
        build_driver(RECIPE, [
            "--objective", "dpo", "--data-path", str(conversations),
            "--tokenizer", str(assets["tokenizer"]), "--seq-len", str(SEQ),
        ])  # fmt: skip


def test_a_reference_of_another_architecture_is_refused_before_the_build(assets, tmp_path):
    other = tiny_model(tmp_path / "other", vocab_size=640)
    with pytest.raises(UsageError, match="--reference .* different architecture: vocab_size"):
        build_driver(RECIPE, [
            "--objective", "dpo", "--data-path", str(assets["pairs"]),
            "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
            "--reference", str(other), "--seq-len", str(SEQ),
        ])  # fmt: skip


@pytest.mark.slow
def test_a_resumed_dpo_run_continues_with_the_same_losses(assets, tmp_path):
    """The rows' position comes back from the checkpoint and the stored reference
    log-probabilities are read again: steps 3-4 after a resume at step 2 equal an
    uninterrupted run's."""

    class StopAtTwo(Callback):
        def on_step_end(self, driver: Any, output: Any) -> None:
            if driver.step == 2:
                driver.control.request_stop("interrupted")

    def losses(run_dir: Path, *extra: str, stop: bool = False) -> dict[int, float]:
        logged = LoggedMetrics()
        driver = build_driver(RECIPE, [
            "--objective", "dpo", "--data-path", str(assets["pairs"]),
            "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
            "--reference", str(assets["reference"]), "--seq-len", str(SEQ),
            "--batch-size", "1", "--max-steps", "4", "--log-every", "1",
            "--save-every", "2", "--run-dir", str(run_dir), "--no-progress", *extra,
        ])  # fmt: skip
        driver.callbacks += [logged, *([StopAtTwo()] if stop else [])]
        driver.fit()
        return {step: metrics["loss"] for step, metrics in logged.metrics.items()}

    whole = losses(tmp_path / "whole")
    assert set(losses(tmp_path / "parts", stop=True)) == {1, 2}
    resumed = losses(tmp_path / "parts", "--resume", "auto")
    assert resumed == {3: whole[3], 4: whole[4]}
    assert len({whole[1], whole[2], whole[3], whole[4]}) == 4  # each step reads other rows


def test_dpo_runs_torchtitans_step_without_cuda_graphs(assets, tmp_path):
    """The loss takes each micro-batch's documents in Python (RowFeed): a replayed CUDA
    graph of the forward-backward would not, so a DPO config turns them off (SFT keeps
    TorchTitan's default)."""
    from baton.backends.torchtitan.objective_loss import ObjectiveLoss

    driver = build_driver(RECIPE, [
        "--objective", "dpo", "--data-path", str(assets["pairs"]),
        "--tokenizer", str(assets["tokenizer"]), "--seq-len", str(SEQ),
        "--dpo-loss", "ipo", "--dpo-beta", "0.5", "--run-dir", str(tmp_path),
    ])  # fmt: skip
    config = driver.backend.config
    assert config.training.disable_cuda_graphs is True
    assert isinstance(config.loss, ObjectiveLoss.Config) and config.loss.run is not None
    assert (config.loss.run["dpo_beta"], config.loss.run["dpo_loss"]) == (0.5, "ipo")


def test_resuming_dpo_with_changed_reference_weights_is_refused(assets, tmp_path):
    import shutil

    reference = tmp_path / "reference"
    shutil.copytree(assets["reference"], reference)
    args = [
        "--objective", "dpo", "--data-path", str(assets["pairs"]),
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--reference", str(reference), "--seq-len", str(SEQ), "--batch-size", "1",
        "--max-steps", "1", "--save-every", "1", "--run-dir", str(tmp_path / "run"),
        "--no-progress",
    ]  # fmt: skip
    build_driver(RECIPE, args).fit()
    shutil.rmtree(reference)
    shutil.copytree(assets["policy"], reference)  # other weights at the same path
    with pytest.raises(UsageError, match="reference_fingerprint"):
        build_driver(RECIPE, [*args, "--max-steps", "2", "--resume", "auto"]).fit()
