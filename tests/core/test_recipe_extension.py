"""``@extends``: a recipe that builds on another keeps every flag of it, with its help,
read from source for ``--help``; and ``def recipe(**kwargs)`` says how to do that."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from baton.core.cli.command import main
from baton.core.cli.recipe import load_recipe
from baton.core.cli.recipe_signature import read_signature, signature_of

BASE = '''
from baton.callbacks import Checkpoint
from baton.core import Driver
from support.scalar_backend import ScalarBackend


def recipe(run_dir: str, max_steps: int = 6, lr: float = 0.1, save_every: int = 3) -> Driver:
    """Gradient descent on a scalar.

    Args:
        run_dir: where the run writes.
        max_steps: steps to train, the base's word.
        lr: the step size.
        save_every: steps between checkpoints.
    """
    return Driver(
        ScalarBackend(lr=lr),
        [Checkpoint(every_n_steps=save_every)],
        max_steps=max_steps,
        log_every=1,
        run_dir=run_dir,
    )
'''

WRAPPER = '''
import json

from baton.core import Callback, Driver
from baton.core.cli.recipe_extension import extends


class WriteScale(Callback):
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def on_train_end(self, driver) -> None:
        seen = {"scale": self.scale, "step": driver.step}
        (driver.options.run_dir / "scale.json").write_text(json.dumps(seen))


@extends("base.py")
def recipe(driver: Driver, scale: float = 2.0, lr: float = 0.05) -> Driver:
    """The scalar run, with a callback of its own.

    Args:
        scale: what WriteScale writes.
    """
    driver.callbacks.append(WriteScale(scale))
    return driver
'''


@pytest.fixture
def wrapper(tmp_path: Path) -> Path:
    (tmp_path / "base.py").write_text(BASE)
    path = tmp_path / "wrapper.py"
    path.write_text(WRAPPER)
    return path


def test_an_extended_recipe_keeps_the_base_flags(
    tmp_path: Path, wrapper: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from_source = read_signature(wrapper)
    assert from_source is not None  # --help imports nothing
    names = [p.name for p in from_source.params]
    assert names == ["run_dir", "max_steps", "lr", "save_every", "scale"]
    imported = signature_of(load_recipe(wrapper))
    assert [(p.name, p.default, p.help) for p in imported.params] == [
        (p.name, p.default, p.help) for p in from_source.params
    ]
    lr = next(p for p in from_source.params if p.name == "lr")
    assert (lr.default, lr.help) == (0.05, "the step size.")  # the wrapper's default

    assert main(["run", str(wrapper), "--help"]) == 0
    screen = " ".join(re.sub(r"[│╭╮╰╯─]", " ", capsys.readouterr().out).split())
    assert "--max-steps INT steps to train, the base's word. (default: 6)" in screen
    assert "--scale FLOAT what WriteScale writes. (default: 2.0)" in screen

    run_dir = tmp_path / "run"
    argv = ["run", str(wrapper), "--run-dir", str(run_dir), "--max-steps", "4", "--scale", "3"]
    assert main(argv) == 0
    assert json.loads((run_dir / "scale.json").read_text()) == {"scale": 3.0, "step": 4}
    settings = json.loads((run_dir / "run.json").read_text())["settings"]
    assert (settings["max_steps"], settings["lr"], settings["scale"]) == (4, 0.05, 3.0)
    assert (run_dir / "checkpoints" / "step_000003").is_dir()  # the base's callbacks too


def test_keywords_without_extends_say_how_to_keep_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loose.py"
    path.write_text("def recipe(**kwargs):\n    '''Wraps something.'''\n")
    assert main(["run", str(path), "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "recipe() takes **keywords" in err and '@extends("base_recipe.py")' in err


def test_a_missing_base_recipe_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "wrapper.py"
    path.write_text(WRAPPER.replace("base.py", "nowhere.py"))
    assert main(["run", str(path), "--help"]) == 2
    err = capsys.readouterr().err
    assert "@extends('nowhere.py'): no recipe file there" in err and "\n" not in err.strip()
