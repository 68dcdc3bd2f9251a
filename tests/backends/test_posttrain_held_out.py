"""One hold-out rule on every engine: a post-training run trains on every row unless
asked to hold some out, with ``--eval-split F`` (the last rows, left out of training) or
``--eval-data-path PREFIX`` (other prepared data), and evaluates them as the objective's
loss over all of them, from its declaration (SFT, DPO and an objective a package
declares, the focal example). Each engine's recipe runs as a user types it.

At ``--lr 1e-12`` the weights stay the starting ones (to 1e-12), so the evaluation after
step 1 is the starting model's: SFT's equals ``transformers`` on each held-out
conversation alone (the mean over their supervised tokens), DPO's equals TRL's
``DPOTrainer`` on the held-out pairs (loss and metrics), the focal loss's equals it
computed on ``transformers``' log-probabilities. A first step on one batch of all the
training rows equals ``transformers`` on exactly those rows. An objective that samples
its rows every step (GRPO) holds none out: asking is refused. MaxText's runs are slow
(XLA compiles every run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support.held_out import (
    FOCAL_OBJECTIVE,
    HELD,
    ROWS,
    focal_evaluation,
    held_out_files,
    run_recipe,
)
from support.posttrain import dpo_reference, sft_reference

ROOT = Path(__file__).resolve().parents[2]
SEQ = 96


def _fabric(rows: int) -> list[str]:
    return ["--batch-size", str(rows)]


def _torchtitan(rows: int) -> list[str]:
    return ["--batch-size", str(rows), "--seq-len", str(SEQ)]


def _megatron(rows: int) -> list[str]:
    return ["--batch-size", str(rows), "--global-batch-size", str(rows), "--seq-len", str(SEQ),
            "--no-async-save"]  # fmt: skip


def _maxtext(rows: int) -> list[str]:
    return ["--batch-size", str(rows), "--seq-len", str(SEQ), "--no-async-save",
            "--overrides", "dtype=float32", "matmul_precision=highest"]  # fmt: skip


#: engine -> (its recipe, its flags for batches of ``rows`` rows; given last)
ENGINES: dict[str, tuple[str, Callable[[int], list[str]]]] = {
    "fabric": ("hf_finetune.py", _fabric),
    "torchtitan": ("torchtitan_llama3_debug.py", _torchtitan),
    "megatron": ("megatron_gpt_tiny.py", _megatron),
    "maxtext": ("maxtext_tiny.py", _maxtext),
}
EVERY_ENGINE = [
    pytest.param(name, marks=pytest.mark.slow) if name == "maxtext" else name for name in ENGINES
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return held_out_files(tmp_path_factory.mktemp("held_out"), SEQ)


def run(engine: str, files: dict[str, Path], run_dir: Path, objective: str, rows: int,
        *extra: str):  # fmt: skip
    recipe, batches = ENGINES[engine]
    data = files["pairs" if objective == "dpo" else "sft"]
    args = [
        "--objective", objective, "--data-path", str(data),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        "--max-steps", "1", "--log-every", "1", "--save-every", "0", "--lr", "1e-12",
        *extra, *batches(rows),
    ]  # fmt: skip
    logged = run_recipe(ROOT / "recipes" / recipe, args, run_dir)
    assert logged.returncode == 0, logged.output
    return logged


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_every_row_trains_unless_asked(engine, files, tmp_path):
    """One batch of all the rows: the first step's loss is ``transformers``' over every
    conversation (nothing silently held out), and no evaluation runs by default."""
    logged = run(engine, files, tmp_path / "r", "sft", ROWS)
    loss, _ = sft_reference(files["policy"], files["sft"], rows=range(ROWS))
    assert logged.train[1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert not logged.eval


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_sft_eval_split_holds_the_last_rows_out_and_evaluates_them(engine, files, tmp_path):
    train_rows = ROWS - len(HELD)
    logged = run(engine, files, tmp_path / "r", "sft", train_rows,
                 "--eval-split", "0.25", "--eval-every", "1")  # fmt: skip
    trained, _ = sft_reference(files["policy"], files["sft"], rows=range(train_rows))
    held, _ = sft_reference(files["policy"], files["sft"], rows=HELD)
    assert logged.train[1]["loss"] == pytest.approx(trained, rel=1e-5)  # the first rows only
    assert logged.eval[1]["eval/loss"] == pytest.approx(held, rel=1e-5)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_sft_eval_data_path_is_evaluated_whole(engine, files, tmp_path):
    logged = run(engine, files, tmp_path / "r", "sft", 4,
                 "--eval-data-path", str(files["sft_eval"]), "--eval-every", "1")  # fmt: skip
    held, _ = sft_reference(files["policy"], files["sft_eval"], rows=range(3))
    assert logged.eval[1]["eval/loss"] == pytest.approx(held, rel=1e-5)


@pytest.mark.parametrize("held_out", ["split", "path"])
@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_dpo_evaluation_is_trl_s_loss_and_metrics_over_the_held_out_pairs(
    engine, files, tmp_path, held_out
):
    flags = ["--eval-every", "1", "--reference", str(files["reference"])]
    if held_out == "split":
        flags += ["--eval-split", "0.25"]
        prefix, rows = files["pairs"], HELD
    else:
        flags += ["--eval-data-path", str(files["pairs_eval"])]
        prefix, rows = files["pairs_eval"], [0, 1, 2]
    logged = run(engine, files, tmp_path / "r", "dpo", 2, *flags)
    trl = dpo_reference(files["policy"], files["reference"], prefix, rows=rows)
    assert logged.eval[1]["eval/loss"] == pytest.approx(trl["loss"], rel=1e-5)
    for name in ("rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert logged.eval[1][f"eval/{name}"] == pytest.approx(trl[name], rel=1e-4, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torchtitan", "megatron"])
def test_held_out_pairs_are_evaluated_whole_over_two_data_parallel_ranks(engine, files, tmp_path):
    """Three held-out pairs over two data-parallel gloo ranks, one row a rank at a time:
    one rank's last batch is a stand-in row that adds nothing, and the evaluation equals
    TRL's over the three pairs."""
    recipe, batches = ENGINES[engine]
    # one row a rank at a time (Megatron: its global batch of 2 over the two ranks)
    args = [
        "--objective", "dpo", "--data-path", str(files["pairs"]),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        "--max-steps", "1", "--log-every", "1", "--save-every", "0", "--lr", "1e-12",
        "--eval-every", "1", "--reference", str(files["reference"]),
        "--eval-data-path", str(files["pairs_eval"]), *batches(2), "--batch-size", "1",
    ]  # fmt: skip
    logged = run_recipe(ROOT / "recipes" / recipe, args, tmp_path / "r", ranks=2)
    assert logged.returncode == 0, logged.output
    trl = dpo_reference(files["policy"], files["reference"], files["pairs_eval"], rows=[0, 1, 2])
    assert logged.eval[1]["eval/loss"] == pytest.approx(trl["loss"], rel=1e-5)
    for name in ("rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert logged.eval[1][f"eval/{name}"] == pytest.approx(trl[name], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_held_out_rows_of_another_kind_are_refused_in_one_line(engine, files, tmp_path):
    recipe, batches = ENGINES[engine]
    args = [
        "--objective", "sft", "--data-path", str(files["sft"]),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        "--eval-data-path", str(files["pairs_eval"]), "--eval-every", "1", *batches(2),
    ]  # fmt: skip
    logged = run_recipe(ROOT / "recipes" / recipe, args, tmp_path / "r")
    lines = [line for line in logged.output.splitlines() if line.startswith("baton:")]
    assert logged.returncode == 2 and len(lines) == 1, logged.output
    assert "holds preference data" in lines[0]


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_an_objective_a_package_declares_is_evaluated_by_its_own_loss(engine, files, tmp_path):
    """The focal example: ``eval/loss`` is its loss over every held-out supervised token
    and ``eval/focal/p`` its metric's sum over its weight, the same numbers as on
    ``transformers``' log-probabilities."""
    logged = run(engine, files, tmp_path / "r", FOCAL_OBJECTIVE, ROWS - len(HELD),
                 "--focal-gamma", "2", "--eval-split", "0.25", "--eval-every", "1")  # fmt: skip
    expected = focal_evaluation(files["policy"], files["sft"], HELD, gamma=2.0)
    assert logged.eval[1]["eval/loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert logged.eval[1]["eval/focal/p"] == pytest.approx(expected["focal/p"], rel=1e-5)


@pytest.mark.parametrize("flag", [("--eval-split", "0.1"), ("--eval-data-path", "prompts")])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_an_objective_that_samples_its_rows_holds_none_out(engine, flag, files, tmp_path):
    """GRPO samples its completions every step: asking it to hold rows out is refused in
    one line, before anything is read or built."""
    recipe, batches = ENGINES[engine]
    args = [
        "--objective", "grpo", "--reward", "accuracy", "--data-path", str(tmp_path / "prompts"),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        *flag, *batches(2),
    ]  # fmt: skip
    logged = run_recipe(ROOT / "recipes" / recipe, args, tmp_path / "r")
    lines = [line for line in logged.output.splitlines() if line.startswith("baton:")]
    assert logged.returncode == 2 and len(lines) == 1, logged.output
    assert f"{flag[0]}: --objective grpo samples its completions every step" in lines[0]
    assert not (tmp_path / "r").exists()
