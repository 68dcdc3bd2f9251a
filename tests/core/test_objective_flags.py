"""A recipe's ``objective: ObjectiveRun | str`` parameter on the command line: expanded
into ``--objective`` and every declared objective's settings, checked against the
declarations, folded into one ``ObjectiveRun`` the recipe receives, recorded flat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from baton.core.cli.objective_flags import expand
from baton.core.cli.recipe import build_driver
from baton.core.cli.recipe_signature import read_signature
from baton.core.errors import RecipeError, UsageError
from baton.core.objectives import OBJECTIVES, ObjectiveRun

RECIPE = Path(__file__).with_name("recipe_objective.py")


def seen() -> ObjectiveRun:
    import importlib

    return importlib.import_module("baton_recipe_recipe_objective").SEEN[-1]


def test_the_objective_expands_into_every_declared_setting():
    signature = read_signature(RECIPE)
    assert signature is not None
    names = [p.name for p in expand(signature).params]
    assert names[:3] == ["run_dir", "max_steps", "objective"]
    for objective in OBJECTIVES.names():
        for setting in OBJECTIVES.get(objective).settings:
            assert setting.name in names, setting.name
    assert names.count("reference") == 1  # shared by dpo and grpo: one flag


def test_the_recipe_gets_its_objective_with_its_settings(tmp_path):
    driver = build_driver(
        RECIPE,
        ["--run-dir", str(tmp_path), "--objective", "dpo", "--dpo-beta", "0.3"],
    )
    assert driver is not None
    run = seen()
    assert (run.name, run["dpo_beta"], run["dpo_loss"]) == ("dpo", 0.3, "sigmoid")
    assert driver.options.settings["objective"] == "dpo"
    assert driver.options.settings["dpo_beta"] == 0.3


def test_grpo_settings_parse_repeated_and_listed_values(tmp_path):
    build_driver(
        RECIPE,
        [
            "--run-dir", str(tmp_path), "--objective", "grpo",
            "--reward", "accuracy:column=solution", "--reward", "format",
            "--reward-weights", "1.0", "0.5", "--num-generations", "4", "--beta", "0.04",
        ],
    )  # fmt: skip
    run = seen()
    assert run["reward"] == ("accuracy:column=solution", "format")
    assert run["reward_weights"] == (1.0, 0.5)
    assert run["num_generations"] == 4
    assert run.reference_use.value == "per_rollout"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--objective", "sft", "--dpo-beta", "0.3"], "--dpo-beta is a setting of --objective dpo"),
        (["--objective", "dpa"], "did you mean 'dpo'"),
        (["--objective", "dpo", "--dpo-beta", "0"], "--dpo-beta must be > 0"),
        (["--objective", "dpo", "--dpo-loss", "hinge"], "--dpo-loss 'hinge': use one of"),
        (["--objective", "grpo"], "pass --reward NAME"),
        (["--objective", "grpo", "--reward", "a", "--num-generations", "1"], "must be >= 2"),
        (
            ["--objective", "grpo", "--reward", "a", "--reward-weights", "1", "2"],
            "2 weights for 1 rewards",
        ),
        (["--objective", "grpo", "--reward", "a", "--loss-type", "ppo"], "--loss-type 'ppo'"),
    ],
)
def test_bad_objective_settings_are_refused_before_the_recipe_runs(tmp_path, argv, message):
    with pytest.raises(UsageError, match=message):
        build_driver(RECIPE, ["--run-dir", str(tmp_path / "run"), *argv])
    assert not (tmp_path / "run").exists()


def test_a_recipe_naming_a_setting_itself_is_refused(tmp_path):
    recipe = tmp_path / "own_beta.py"
    recipe.write_text(
        RECIPE.read_text().replace(
            'objective: ObjectiveRun | str = "pretrain"',
            'objective: ObjectiveRun | str = "pretrain", dpo_beta: float = 0.1',
        )
    )
    with pytest.raises(RecipeError, match="'dpo_beta' is a setting of --objective dpo"):
        build_driver(recipe, ["--run-dir", str(tmp_path / "run")])


def test_help_and_config_files_read_the_declarations(tmp_path):
    env_python = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE)]
    shown = subprocess.run(
        [*env_python, "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--dpo-beta" in shown and "--num-generations" in shown and "--objective" in shown
    config = tmp_path / "run.yaml"
    config.write_text("objective: dpo\ndpo_loss: ipo\n")
    printed = subprocess.run(
        [*env_python, "--run-dir", str(tmp_path / "r"), "--config", str(config), "--print-config"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "objective: dpo" in printed and "dpo_loss: ipo" in printed


def test_a_resume_refuses_another_objective(tmp_path):
    run_dir = tmp_path / "run"
    cli = [sys.executable, "-m", "baton.core.cli.command", "run", str(RECIPE)]
    env = {"PYTHONPATH": str(Path(__file__).parents[1])}
    import os

    env = {**os.environ, **env}
    subprocess.run([*cli, "--run-dir", str(run_dir), "--objective", "sft"], env=env, check=True)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["settings"]["objective"] == "sft"
    again = subprocess.run(
        [*cli, "--run-dir", str(run_dir), "--objective", "dpo", "--max-steps", "4",
         "--resume", "auto", "--allow-changed", "max_steps"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 2, again.stderr
    assert "objective" in again.stderr


FOCAL = Path(__file__).parents[2] / "examples" / "objectives" / "focal.py"


def test_an_objective_of_ones_own_is_named_by_its_file(tmp_path):
    build_driver(
        RECIPE,
        ["--run-dir", str(tmp_path), "--objective", f"{FOCAL}:FOCAL", "--focal-gamma", "1.5"],
    )
    run = seen()
    assert (run.name, run["focal_gamma"]) == ("focal", 1.5)
    assert run.objective.data.value == "sft"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("missing.py:FOCAL", "does not exist"),
        (f"{FOCAL}:FOCUS", "defines no Objective named 'FOCUS'"),
        (f"{FOCAL}:focal_loss", "defines no Objective named 'focal_loss'"),
    ],
)
def test_a_path_naming_no_objective_is_refused(tmp_path, value, message):
    with pytest.raises(UsageError, match=message):
        build_driver(RECIPE, ["--run-dir", str(tmp_path / "run"), "--objective", value])
    assert not (tmp_path / "run").exists()
