"""The baton command line: recipes' flags, help, bad arguments, listings."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from baton.core.cli.command import checkpoint_run_dir, main
from baton.core.cli.recipe import RecipeError, build_driver

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.py"


def baton(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_help_lists_parameters_with_defaults():
    out = baton("run", str(QUICKSTART), "--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for flag in ("--max-steps", "--lr", "--batch-size", "--resume", "--patches"):
        assert flag in text
    assert "300" in text and "0.002" in text


def test_bad_argument_value_names_the_argument():
    out = baton("run", str(QUICKSTART), "--max-steps", "many")
    assert out.returncode != 0
    assert "--max-steps" in out.stdout + out.stderr


def test_unknown_argument_is_rejected():
    out = baton("run", str(QUICKSTART), "--max-stepz", "5")
    assert out.returncode != 0
    assert "--max-stepz" in out.stdout + out.stderr


def test_missing_recipe_file_and_function(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        build_driver(tmp_path / "nope.py")
    bad = tmp_path / "bad.py"
    bad.write_text("def train():\n    pass\n")
    with pytest.raises(RecipeError, match="no function named 'recipe'"):
        build_driver(bad)
    assert main(["run", str(bad)]) == 2


def test_recipe_parameters_reach_the_driver_and_its_settings(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text(
        textwrap.dedent("""
        from support.scalar_backend import ScalarBackend
        from baton.core import Driver

        def recipe(steps: int = 3, lr: float = 0.1, run_dir: str = "x") -> Driver:
            return Driver(ScalarBackend(lr=lr), max_steps=steps, run_dir=run_dir)
    """)
    )
    driver = build_driver(
        recipe,
        [
            "--steps",
            "7",
            "--lr",
            "0.25",
            "--run-dir",
            str(tmp_path / "run"),
            "--resume",
            "auto",
            "--patches",
            "none",
        ],
    )
    assert driver.options.max_steps == 7 and driver.backend.config["lr"] == 0.25
    assert driver.options.resume == "auto" and driver.options.patches == "none"
    assert driver.options.settings["steps"] == 7 and driver.options.settings["recipe"] == str(
        recipe
    )
    assert driver.fit().step == 7


def test_listings():
    out = baton("callbacks")
    assert out.returncode == 0 and "progress" in out.stdout
    # a summary that spans lines is shown whole, not cut mid-sentence
    assert "each tagged with its phase" in " ".join(out.stdout.split())
    out = baton("patches", "--backend", "jax")
    assert out.returncode == 0 and "registers no patches" in out.stdout
    out = baton("backends")
    assert out.returncode == 0 and "fabric" in out.stdout
    out = baton("patches", "--backend", "nope")
    assert out.returncode == 2 and "unknown backend" in out.stderr
    out = baton("frobnicate")
    assert out.returncode == 2 and "unknown command" in out.stderr


SCALAR = ROOT / "tests" / "safety" / "recipe_scalar.py"


def test_eval_rebuilds_the_run_and_keeps_its_own_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`baton eval` builds the run from the checkpoint's recorded settings (flags
    override), warns of nothing, says it evaluates (not that it resumed), and logs into RUN_DIR/evals/<checkpoint>, replaced on
    each evaluation: the run's own logs and the recipe's default run directory stay as
    they are (unless --run-dir is given); `baton eval --help` explains itself."""
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        SCALAR.read_text().replace("    run_dir: str,", '    run_dir: str = "runs/default",')
    )
    trained = tmp_path / "trained"
    argv = ["run", str(recipe), "--run-dir", str(trained), "--max-steps", "6", "--lr", "0.05"]
    assert main(argv) == 0
    before = (trained / "logs" / "metrics.jsonl").read_text()
    checkpoint = trained / "checkpoints" / "latest"
    assert checkpoint_run_dir(checkpoint) == trained
    capsys.readouterr()

    for _ in range(2):  # a second evaluation replaces the first's record
        assert main(["eval", str(recipe), "--checkpoint", str(checkpoint)]) == 0
        out, err = capsys.readouterr()
        assert "eval/loss" in out and "resuming with" not in err  # --lr 0.05 came along
        assert "resumed from" not in out + err and f"evaluating {checkpoint} (step 6)" in out
    assert not (tmp_path / "runs").exists(), "eval wrote into the recipe's default run dir"
    assert (trained / "logs" / "metrics.jsonl").read_text() == before  # the run's own record
    record = (trained / "evals" / "step_000006" / "logs" / "metrics.jsonl").read_text()
    assert [(r["step"], r["phase"]) for r in map(json.loads, record.splitlines())] == [(6, "eval")]

    argv = ["eval", str(recipe), "--checkpoint", str(checkpoint), "--lr", "0.1"]
    assert main(argv) == 2  # a flag overrides: the scalar backend describes its lr
    assert "lr: checkpoint has 0.05, this run has 0.1" in capsys.readouterr().err

    other = tmp_path / "other"  # an explicit --run-dir is honoured
    argv = ["eval", str(recipe), "--checkpoint", str(checkpoint), "--run-dir", str(other)]
    assert main(argv) == 0
    assert (other / "logs" / "metrics.jsonl").is_file()

    assert main(["eval", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--checkpoint" in text and "evals/<checkpoint>" in text
    assert main(["eval", str(recipe)]) == 2
    assert "--checkpoint CHECKPOINT_DIR is required" in capsys.readouterr().err


@pytest.mark.parametrize("args", [("run", str(QUICKSTART), "--help"), ("callbacks",)])
def test_output_into_a_closed_pipe_ends_quietly(args):
    """`baton ... | head`: the reader is gone before baton writes; no BrokenPipeError."""
    process = subprocess.Popen(
        [sys.executable, "-m", "baton.core.cli.command", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader leaves at once, as `head` does after its lines
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert err == ""
