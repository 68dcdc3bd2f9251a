"""Everyday command line: per-flag help from the recipe's docstring (without importing
torch), ``--config`` files, ``--print-config``, ``--set`` on the native config, and the
run record every run leaves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from baton.core.cli.command import main
from baton.core.cli.recipe import RecipeError, build_driver

ROOT = Path(__file__).resolve().parents[2]
RECIPE = textwrap.dedent(
    '''
    from baton.core import Driver
    from support.scalar_backend import ScalarBackend


    def recipe(run_dir: str, max_steps: int = 4, lr: float = 2e-3, name: str = "a") -> Driver:
        """Descend on a scalar.

        Args:
            run_dir: where the run goes.
            max_steps: optimizer steps to take.
            lr: peak learning rate.
            name: what to call it.
        """
        return Driver(ScalarBackend(lr=lr), max_steps=max_steps, run_dir=run_dir)
    '''
)


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    path = tmp_path / "scalar_recipe.py"
    path.write_text(RECIPE)
    return path


def test_help_shows_each_flag_with_its_docstring_and_default(recipe_file, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_driver(recipe_file, ["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--lr FLOAT" in out and "peak learning rate" in out and "0.002" in out
    assert "optimizer steps to take" in out and "Descend on a scalar." in out
    assert "--config" in out and "--print-config" in out and "--set" in out


def test_help_of_a_torch_recipe_imports_no_torch() -> None:
    code = (
        "import sys\nfrom baton.core.cli.command import main\n"
        f"try:\n    main(['run', {str(ROOT / 'recipes' / 'quickstart.py')!r}, '--help'])\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'jax', 'lightning') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--max-steps" in done.stdout


@pytest.mark.parametrize(
    "name, text",
    [("c.yaml", "max_steps: 7\nlr: 0.5\nname: from-file\n"),
     ("c.toml", 'max-steps = 7\nlr = 0.5\nname = "from-file"\n')],
)  # fmt: skip
def test_config_file_values_and_flags_over_them(recipe_file, tmp_path, name, text) -> None:
    config = tmp_path / name
    config.write_text(text)
    driver = build_driver(
        recipe_file, ["--run-dir", str(tmp_path / "r"), "--config", str(config), "--lr", "0.25"]
    )
    assert driver.options.max_steps == 7 and driver.options.settings["name"] == "from-file"
    assert driver.options.settings["lr"] == 0.25 and driver.backend.config["lr"] == 0.25


def test_print_config_prints_resolved_values_and_trains_nothing(recipe_file, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 9\n")
    run_dir = tmp_path / "r"
    code = main(["run", str(recipe_file), "--run-dir", str(run_dir), "--config", str(config),
                 "--name", "b", "--print-config"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "max_steps: 9" in out and "name: b" in out and "lr: 0.002" in out
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "config, message",
    [("max_stepz: 3\n", "unknown parameter 'max_stepz' .did you mean 'max_steps'"),
     ("qqq: 3\n", "unknown parameters ['qqq']; the recipe takes"),
     ("max_steps: [\n", "does not parse"),
     ("- 1\n", "expected a table")],
)  # fmt: skip
def test_bad_config_files_are_named(recipe_file, tmp_path, config, message) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(config)
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--config", str(path)])


def test_set_overrides_native_config_fields(recipe_file, tmp_path) -> None:
    driver = build_driver(
        recipe_file, ["--run-dir", str(tmp_path / "r"), "--set", "lr=0.75", "--set", "seed=3"]
    )
    assert driver.backend.config == {"lr": 0.75, "seed": 3}
    assert driver.options.settings["set"] == {"lr": 0.75, "seed": 3}
    with pytest.raises(RecipeError, match="has no field 'lrr'; fields: lr, seed"):
        build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--set", "lrr=1"])
    with pytest.raises(RecipeError, match="expected a int like the current 0, got 'fast'"):
        build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--set", "seed=fast"])
    with pytest.raises(RecipeError, match="write KEY.PATH=VALUE"):
        build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--set", "lr"])


def test_set_walks_nested_dataclasses() -> None:
    from dataclasses import dataclass, field

    from baton.core.cli.overrides import OverrideError, apply_overrides

    @dataclass
    class Training:
        seq_len: int = 2048
        lr: float = 1e-3
        betas: tuple[float, float] = (0.9, 0.95)

    @dataclass
    class Config:
        training: Training = field(default_factory=Training)
        compile: bool = False

    config = Config()
    applied = apply_overrides(
        config,
        ["training.seq_len=4096", "training.lr=3", "compile=true", "training.betas=[0.8, 0.9]"],
    )
    assert config.training == Training(seq_len=4096, lr=3.0, betas=(0.8, 0.9)) and config.compile
    assert applied["training.seq_len"] == 4096
    with pytest.raises(OverrideError, match="training has no field 'seqlen'; fields: seq_len, lr"):
        apply_overrides(config, ["training.seqlen=1"])


def test_set_walks_list_indices() -> None:
    """A list element is named by its index (TorchTitan's optimizer parameter groups)."""
    from dataclasses import dataclass, field

    from baton.core.cli.overrides import OverrideError, apply_overrides

    @dataclass
    class Group:
        kwargs: dict[str, object] = field(default_factory=lambda: {"weight_decay": 0.1})

    @dataclass
    class Optimizer:
        groups: list[Group] = field(default_factory=lambda: [Group(), Group()])

    config = Optimizer()
    apply_overrides(config, ["groups.1.kwargs.weight_decay=0.0"])
    assert [g.kwargs["weight_decay"] for g in config.groups] == [0.1, 0.0]
    with pytest.raises(OverrideError, match="groups has no field '2'; fields: 0, 1"):
        apply_overrides(config, ["groups.2.kwargs.weight_decay=0.0"])


def test_every_run_leaves_a_run_record_and_tensorboard_hparams(recipe_file, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from baton.callbacks import CompositeLogger

    run_dir = tmp_path / "r"
    driver = build_driver(recipe_file, ["--run-dir", str(run_dir), "--lr", "0.5"])
    driver.callbacks.append(CompositeLogger(["tensorboard"]))
    driver.backend.fail_at = 2  # the run dies before any checkpoint
    with pytest.raises(RuntimeError):
        driver.fit()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["settings"]["lr"] == 0.5 and record["native_config"] == {"lr": 0.5, "seed": 0}
    assert record["backend"]["name"] == "scalar" and record["world_size"] == 1
    assert record["versions"]["baton-core"] and record["command"] and record["host"]
    assert record["launch"]["source"] == "single"
    events = next((run_dir / "logs" / "tensorboard").glob("events.*"))
    tags = {v.tag for e in EventFileLoader(str(events)).Load() for v in e.summary.value}
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= tags


@pytest.mark.parametrize(
    "config, message",
    [("max_steps: forty\n", "max_steps is 'forty', not a whole number"),
     ("lr: fast\n", "lr is 'fast', not a number"),
     ("max-steps = 2.5\n", "max_steps is 2.5, not a whole number"),
     ("name: [a, b]\n", "name is ['a', 'b'], not text"),
     ("overwrite: maybe\n", "overwrite is 'maybe', not true or false")],
)  # fmt: skip
def test_config_values_of_the_wrong_type_are_named(recipe_file, tmp_path, config, message) -> None:
    """A file's value of the wrong type is refused before the recipe runs (and by
    --print-config), naming the parameter, the value and the type."""
    path = tmp_path / ("bad.toml" if "=" in config else "bad.yaml")
    path.write_text(config)
    argv = ["--run-dir", str(tmp_path / "r"), "--config", str(path)]
    with pytest.raises(RecipeError, match=re.escape(message)):
        build_driver(recipe_file, argv)
    with pytest.raises(RecipeError, match=re.escape(message)):
        build_driver(recipe_file, [*argv, "--print-config"])


def test_config_numbers_yaml_leaves_as_text_are_numbers(recipe_file, tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\n")  # YAML 1.1 reads this as a string
    driver = build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--config", str(path)])
    assert driver.options.settings["lr"] == 0.001 and driver.backend.config["lr"] == 0.001


def test_eval_every_zero_turns_evaluation_off(recipe_file, tmp_path) -> None:
    from baton.core import Driver
    from support.scalar_backend import ScalarBackend

    driver = Driver(ScalarBackend(), max_steps=4, eval_every=0, run_dir=tmp_path / "r")
    assert driver.options.eval_every is None
    seen: list[int] = []

    from baton.core import Callback

    class Evals(Callback):
        def on_eval_end(self, driver, metrics):
            seen.append(driver.step)

    driver.callbacks.append(Evals())
    driver.fit()
    assert seen == []


def test_a_dropped_callback_turns_the_recipes_switch_of_its_name_off(tmp_path, capsys) -> None:
    """``--no-callback progress`` on a recipe that takes ``progress: bool``: the printed
    config (and the run's settings) read ``progress: false``, and the run has no bar."""
    recipe = tmp_path / "switch_recipe.py"
    recipe.write_text(
        textwrap.dedent(
            '''
            from baton.callbacks import Progress
            from baton.core import Driver
            from support.scalar_backend import ScalarBackend


            def recipe(run_dir: str, progress: bool = True) -> Driver:
                """Descend on a scalar.

                Args:
                    run_dir: where the run goes.
                    progress: show the progress bar.
                """
                callbacks = [Progress()] if progress else []
                return Driver(ScalarBackend(), max_steps=1, run_dir=run_dir, callbacks=callbacks)
            '''
        )
    )
    argv = ["--run-dir", str(tmp_path / "r"), "--no-callback", "progress"]
    assert main(["run", str(recipe), *argv, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["progress"] is False and printed["no_callbacks"] == ["progress"]
    driver = build_driver(recipe, argv)
    assert driver is not None and driver.callbacks == []
    assert driver.options.settings["progress"] is False


def test_run_flags_come_from_one_table_and_reach_the_driver(recipe_file, tmp_path) -> None:
    import dataclasses

    from baton.core.cli.recipe import RUN_OPTION_FLAGS
    from baton.core.options import RunOptions

    options = {f.name for f in dataclasses.fields(RunOptions)}
    assert set(RUN_OPTION_FLAGS) <= options
    assert {"resume", "verify", "overwrite", "allow_changed"} <= set(RUN_OPTION_FLAGS)
    assert "dry_run" not in RUN_OPTION_FLAGS and "set" not in RUN_OPTION_FLAGS
    driver = build_driver(
        recipe_file,
        ["--run-dir", str(tmp_path / "r"), "--verify", "size", "--allow-changed", "lr"],
    )
    assert driver.options.verify == "size"
    assert driver.options.allow_changed == frozenset({"lr"})
    config = tmp_path / "c.yaml"
    config.write_text("print_config: true\n")
    with pytest.raises(RecipeError, match="unknown parameters"):
        build_driver(recipe_file, ["--run-dir", str(tmp_path / "r"), "--config", str(config)])


def test_a_backends_keyword_fields_are_set_by_name_and_a_wrong_one_is_named() -> None:
    import dataclasses

    from baton.core.cli.overrides import set_fields

    @dataclasses.dataclass
    class TinyConfig:
        seq_len: int = 8
        lr: float = 1e-3

    config = TinyConfig()
    set_fields(config, {"seq_len": 64, "lr": 0.5})
    assert config == TinyConfig(seq_len=64, lr=0.5)
    with pytest.raises(TypeError, match=r"^TinyConfig has no field 'seqlen'; use seq_len$"):
        set_fields(config, {"seqlen": 1}, hint="; use seq_len")
    assert config == TinyConfig(seq_len=64, lr=0.5)
