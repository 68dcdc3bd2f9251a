"""TorchTitan post-training holds nothing out unless asked: every row trains by default, and
``--eval-split F`` (the last rows, left out of training) or ``--eval-data-path PREFIX``
is evaluated as the objective's loss over all of it (every held-out row through
TorchTitan's model, split over the data-parallel ranks), as a user runs
``recipes/torchtitan_llama3_debug.py``. At ``--lr 0`` the evaluation is the starting model's: SFT's
equals ``transformers`` on each held-out conversation alone, DPO's TRL's ``DPOTrainer``
on the held-out pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from support.held_out import HELD, ROWS, held_out_files, run_recipe
from support.posttrain import dpo_reference, sft_reference

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "torchtitan_llama3_debug.py"
SEQ = 96


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return held_out_files(tmp_path_factory.mktemp("held_out"), SEQ)


def args(files: dict[str, Path], objective: str, data: str, *extra: str) -> list[str]:
    return [
        "--objective", objective, "--data-path", str(files[data]),
        "--init-from", str(files["policy"]), "--tokenizer", str(files["tokenizer"]),
        "--max-steps", "1", "--log-every", "1", "--save-every", "0", "--lr", "1e-12",
        "--seq-len", str(SEQ), *extra,
    ]  # fmt: skip


def test_every_row_trains_unless_asked(files, tmp_path):
    """One batch of all the rows: the first step's loss is ``transformers``' over every
    conversation (nothing silently held out), and no evaluation runs by default."""
    run = run_recipe(RECIPE, args(files, "sft", "sft", "--batch-size", str(ROWS)), tmp_path / "r")
    assert run.returncode == 0, run.output
    loss, _ = sft_reference(files["policy"], files["sft"], rows=range(ROWS))
    assert run.train[1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert not run.eval


def test_sft_eval_split_holds_the_last_rows_out_and_evaluates_them(files, tmp_path):
    train_rows = ROWS - len(HELD)
    flags = ("--batch-size", str(train_rows), "--eval-split", "0.25", "--eval-every", "1")
    run = run_recipe(RECIPE, args(files, "sft", "sft", *flags), tmp_path / "r")
    assert run.returncode == 0, run.output
    trained, _ = sft_reference(files["policy"], files["sft"], rows=range(train_rows))
    held, _ = sft_reference(files["policy"], files["sft"], rows=HELD)
    assert run.train[1]["loss"] == pytest.approx(trained, rel=1e-5)  # only the first rows
    assert run.eval[1]["eval/loss"] == pytest.approx(held, rel=1e-5)


def test_sft_eval_data_path_is_evaluated_whole(files, tmp_path):
    flags = ("--batch-size", "4", "--eval-data-path", str(files["sft_eval"]), "--eval-every", "1")
    run = run_recipe(RECIPE, args(files, "sft", "sft", *flags), tmp_path / "r")
    assert run.returncode == 0, run.output
    held, _ = sft_reference(files["policy"], files["sft_eval"], rows=range(3))
    assert run.eval[1]["eval/loss"] == pytest.approx(held, rel=1e-5)


@pytest.mark.parametrize("held_out", ["split", "path"])
def test_dpo_evaluation_is_trl_s_loss_and_metrics_over_the_held_out_pairs(
    files, tmp_path, held_out
):
    flags = ["--batch-size", "2", "--eval-every", "1", "--reference", str(files["reference"])]
    if held_out == "split":
        flags += ["--eval-split", "0.25"]
        prefix, rows = files["pairs"], HELD
    else:
        flags += ["--eval-data-path", str(files["pairs_eval"])]
        prefix, rows = files["pairs_eval"], [0, 1, 2]
    run = run_recipe(RECIPE, args(files, "dpo", "pairs", *flags), tmp_path / "r")
    assert run.returncode == 0, run.output
    trl = dpo_reference(files["policy"], files["reference"], prefix, rows=rows)
    evaluated = run.eval[1]
    for name in ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen"):
        assert evaluated[f"eval/{name}"] == pytest.approx(trl[name], rel=1e-5, abs=1e-6), name


def test_held_out_rows_of_another_kind_are_refused_in_one_line(files, tmp_path):
    flags = ("--eval-data-path", str(files["pairs_eval"]), "--eval-every", "1")
    run = run_recipe(RECIPE, args(files, "sft", "sft", *flags), tmp_path / "r")
    lines = [line for line in run.output.splitlines() if line.startswith("baton:")]
    assert run.returncode == 2 and len(lines) == 1, run.output
    assert "holds preference data" in lines[0]
    assert not (tmp_path / "r").exists()
