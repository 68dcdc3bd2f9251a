"""Every recipe flag has a help line, and ``baton run RECIPE --help`` prints it.

The recipes are read from source (``read_signature``): nothing here imports torch or jax.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from baton.core.cli import main
from baton.core.recipe_signature import Signature, read_signature

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.py"))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def signature(path: Path) -> Signature:
    found = read_signature(path)
    assert found is not None, f"{path.name}: recipe() is not readable from source"
    return found


def plain(text: str) -> str:
    """The help screen without its box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_there_are_recipes():
    assert len(RECIPES) >= 10, [p.name for p in RECIPES]


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_parameter_has_help(path: Path):
    missing = [p.name for p in signature(path).params if not p.help.strip()]
    assert not missing, (
        f"{path.name}: recipe() parameters without a help line: {missing}; "
        "describe each under 'Args:' in recipe()'s docstring"
    )


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_run_help_prints_each_flag_with_its_help(path: Path, capsys: pytest.CaptureFixture[str]):
    params = signature(path).params
    assert main(["run", str(path), "--help"]) == 0
    screen = plain(capsys.readouterr().out)
    for param in params:
        assert flag(param.name) in screen, f"{path.name}: {flag(param.name)} not in --help"
        assert " ".join(param.help.split()) in screen, (
            f"{path.name}: the help of {flag(param.name)} ({param.help!r}) not in --help"
        )
