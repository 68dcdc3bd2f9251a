"""Post-training on Megatron-Core: SFT and DPO on packed rows through Megatron's own step
(its schedule, per-token loss normalisation and optimizer), against the references
outside baton: ``transformers`` on each conversation alone for SFT, TRL's ``DPOTrainer``
for DPO, on the same weights and data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from baton.core import Callback
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver
from support.posttrain import (
    DPO_METRICS,
    LoggedMetrics,
    dpo_reference,
    posttrain_files,
    sft_reference,
    tiny_model,
)

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
SEQ_LEN = 128


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return posttrain_files(tmp_path_factory.mktemp("posttrain"), SEQ_LEN)


def run_argv(fixtures: dict[str, Path], run_dir: Path, *extra: str, steps: int = 1) -> list[str]:
    return [
        "--init-from", str(fixtures["policy"]), "--tokenizer", str(fixtures["tokenizer"]),
        "--seq-len", str(SEQ_LEN), "--batch-size", "2", "--global-batch-size", "4",
        "--max-steps", str(steps), "--log-every", "1", "--save-every", "0", "--no-async-save",
        "--no-progress", "--run-dir", str(run_dir), *extra,
    ]  # fmt: skip


def first_step(argv: list[str]) -> dict[str, float]:
    driver = build_driver(RECIPE, argv)
    record = LoggedMetrics()
    driver.callbacks.append(record)
    driver.fit()
    return record.metrics[1]


def test_sft_first_step_equals_transformers_on_each_conversation(fixtures, tmp_path):
    """Two micro-batches of two packed rows: Megatron's loss (the mean over all supervised
    tokens of the step) and gradient norm equal transformers' on the rows' conversations
    one by one, unpacked."""
    argv = run_argv(fixtures, tmp_path / "run", "--objective", "sft")
    got = first_step([*argv, "--data-path", str(fixtures["sft"])])
    loss, grad_norm = sft_reference(fixtures["policy"], fixtures["sft"], rows=[0, 1, 2, 3])
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [("--tp", "2"), ("--pp", "2"), ()], ids=["tp2", "pp2", "dp2"])
def test_sft_first_step_equals_transformers_on_two_ranks(fixtures, tmp_path, layout):
    """The same four rows on two gloo ranks: tensor parallel 2 or pipeline parallel 2 (two
    micro-batches each), or data parallel 2 (one micro-batch a rank, the token count
    summed over ranks by Megatron before it divides the gradients)."""
    import json

    from support.torchrun import torchrun

    argv = run_argv(fixtures, tmp_path / "run", "--objective", "sft", *layout)
    out = tmp_path / "metrics.json"
    worker = Path(__file__).with_name("posttrain_worker.py")
    torchrun(worker, str(out), str(RECIPE), *argv, "--data-path", str(fixtures["sft"]))
    got = json.loads(out.read_text())["1"]
    loss, grad_norm = sft_reference(fixtures["policy"], fixtures["sft"], rows=[0, 1, 2, 3])
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)


def test_data_of_another_objective_is_refused_before_the_model_is_built(fixtures, tmp_path, capsys):
    """SFT data in a pretraining run and pretraining text in an SFT run: one line, exit 2,
    before the model is built (no checkpoint written)."""
    import json

    from baton.tools.data.prepare import prepare

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"the model reads {i}"}) + "\n" for i in range(20))
    )
    prepare([corpus], fixtures["tokenizer"], tmp_path / "text", workers=1)
    cases = [
        ((), fixtures["sft"], "--objective sft"),
        (("--objective", "sft"), tmp_path / "text", "pretraining text"),
        (("--objective", "dpo"), fixtures["sft"], "--objective sft"),
    ]
    for flags, data, expected in cases:
        run_dir = tmp_path / f"run{len(flags)}{Path(data).name}"
        argv = [*run_argv(fixtures, run_dir, *flags), "--data-path", str(data)]
        capsys.readouterr()
        assert baton(["run", str(RECIPE), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err
        assert not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
def test_dpo_first_step_equals_trl(fixtures, tmp_path, kind):
    """DPO against a reference other than the policy: the reference log-probabilities are
    computed once by Megatron and stored beside the data, then the first step's loss and
    TRL's metrics equal DPOTrainer's on the same pairs; a second run reads them back."""
    import glob

    def argv(run_dir: Path) -> list[str]:
        return [
            *run_argv(fixtures, run_dir, "--objective", "dpo", "--dpo-loss", kind),
            "--data-path", str(fixtures["pairs"]), "--reference", str(fixtures["reference"]),
            "--dpo-beta", "0.2",
        ]  # fmt: skip

    got = first_step(argv(tmp_path / "run"))
    trl = dpo_reference(
        fixtures["policy"], fixtures["reference"], fixtures["pairs"], rows=[0, 1, 2, 3],
        beta=0.2, loss_type=kind,
    )  # fmt: skip
    assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    # rewards are differences of log-probability sums (~100 here) in float32 on both
    # sides: equal within float32's rounding of those sums
    rounding = 1e-6 * 0.2 * max(abs(trl["logps/chosen"]), abs(trl["logps/rejected"]))
    for name in DPO_METRICS:
        assert got[name] == pytest.approx(trl[name], rel=1e-5, abs=rounding), name
    stored = glob.glob(f"{fixtures['pairs']}.reference-*.npy")
    assert len(stored) == 1 and Path(stored[0]).with_suffix(".json").is_file()
    if kind == "sigmoid":  # read back, not computed again: the same loss
        modified = Path(stored[0]).stat().st_mtime_ns
        assert first_step(argv(tmp_path / "again"))["loss"] == got["loss"]
        assert Path(stored[0]).stat().st_mtime_ns == modified


def test_dpo_without_a_start_or_with_another_architecture_is_refused(fixtures, tmp_path, capsys):
    """DPO needs the starting weights, and a reference of the policy's architecture: one
    line, exit 2, before the model is built."""
    other = tiny_model(tmp_path / "qwen3", family="qwen3")
    argv = [
        *run_argv(fixtures, tmp_path / "run", "--objective", "dpo"),
        "--data-path", str(fixtures["pairs"]),
    ]  # fmt: skip
    cases = [
        ([*argv, "--reference", str(other)], "different architecture"),
        ([a for a in argv if a != str(fixtures["policy"]) and a != "--init-from"], "--init-from"),
    ]
    for flags, expected in cases:
        capsys.readouterr()
        assert baton(["run", str(RECIPE), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("layout", [("--pp", "2"), ()], ids=["pp2", "dp2"])
def test_dpo_first_step_equals_trl_on_two_ranks(fixtures, tmp_path, layout):
    """DPO on two gloo ranks, its reference log-probabilities computed there too (a fresh
    copy of the pairs): pipeline parallel 2 (the last stage scores), or data parallel 2
    (each rank scores and trains on its own rows, whole pairs)."""
    import json
    import shutil

    from support.torchrun import torchrun

    prefix = tmp_path / "pairs"
    for suffix in (".bin", ".idx", ".mask.bin", ".json"):
        shutil.copy(f"{fixtures['pairs']}{suffix}", f"{prefix}{suffix}")
    argv = [
        *run_argv(fixtures, tmp_path / "run", "--objective", "dpo", *layout),
        "--data-path", str(prefix), "--reference", str(fixtures["reference"]),
    ]  # fmt: skip
    out = tmp_path / "metrics.json"
    torchrun(Path(__file__).with_name("posttrain_worker.py"), str(out), str(RECIPE), *argv)
    got = json.loads(out.read_text())["1"]
    trl = dpo_reference(fixtures["policy"], fixtures["reference"], prefix, rows=[0, 1, 2, 3])
    assert got["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert got["rewards/accuracies"] == trl["rewards/accuracies"]
    assert len(list(tmp_path.glob("pairs.reference-*.npy"))) == 1


class StopAfter(Callback):
    """Stop the run after ``step``, saving a checkpoint (as a preempted run does)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.step:
            driver.control.request_save("test")
            driver.control.request_stop("test")


def test_sft_resumes_where_it_stopped_and_a_dpo_reference_change_is_refused(fixtures, tmp_path):
    """An SFT run stopped after 2 of 3 steps and resumed gives step 3 the loss of a run
    that never stopped (the rows consumed are in the checkpoint); a DPO checkpoint records
    its reference, and resuming it against another reference is refused."""
    from baton.core.errors import UsageError

    def run(
        objective: str, run_dir: Path, *extra: str, stop: int = 0
    ) -> dict[int, dict[str, float]]:
        argv = run_argv(fixtures, run_dir, "--objective", objective, "--lr", "1e-2", steps=3)
        data = fixtures["sft" if objective == "sft" else "pairs"]
        driver = build_driver(RECIPE, [*argv, "--data-path", str(data), *extra])
        record = LoggedMetrics()
        driver.callbacks += [record, StopAfter(stop)] if stop else [record]
        driver.fit()
        return record.metrics

    straight = run("sft", tmp_path / "straight")
    run("sft", tmp_path / "stopped", stop=2)
    resumed = run("sft", tmp_path / "stopped", "--resume", "auto")
    assert list(resumed) == [3] and resumed[3]["loss"] == straight[3]["loss"]

    run("dpo", tmp_path / "dpo", "--reference", str(fixtures["reference"]), stop=1)
    with pytest.raises(UsageError, match="different setup:\n  reference: checkpoint has"):
        run("dpo", tmp_path / "dpo", "--reference", str(fixtures["policy"]), "--resume", "auto")


def test_evaluation_of_a_post_training_run_is_refused_with_the_reason(fixtures, tmp_path):
    """SFT trains on every row: asking to evaluate fails before the first step, saying why."""
    from baton.core.abilities import MissingAbilityError

    argv = run_argv(fixtures, tmp_path / "run", "--objective", "sft")
    driver = build_driver(RECIPE, [*argv, "--data-path", str(fixtures["sft"])])
    driver.options = driver.options.replace(eval_every=1)
    with pytest.raises(MissingAbilityError, match="no validation split"):
        driver.fit()
