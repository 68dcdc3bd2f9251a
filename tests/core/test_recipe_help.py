"""Every recipe flag has a help line, and ``baton run RECIPE --help`` prints it.

The recipes are read from source (``read_signature``): nothing here imports torch or jax.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from baton.core.cli.command import main
from baton.core.cli.recipe_signature import Signature, read_signature

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
    raw = capsys.readouterr().out
    check_help_is_clean(path, raw)
    screen = plain(raw)
    for param in params:
        assert flag(param.name) in screen, f"{path.name}: {flag(param.name)} not in --help"
        assert " ".join(param.help.split()) in screen, (
            f"{path.name}: the help of {flag(param.name)} ({param.help!r}) not in --help"
        )


def check_help_is_clean(path: Path, raw: str) -> None:
    """No hint twice (tyro's ``(repeatable)`` or ``(default: ...)`` after the help's own),
    no blank line inside or doubled between the description's paragraphs."""
    screen = plain(raw)
    assert "(repeatable) (repeatable)" not in screen and "repeatable;" not in screen
    doubled = re.search(r"default: [^()]*(\([^()]*\)[^()]*)*\)\.? \(default: ", screen)
    assert doubled is None, f"{path.name}: two defaults in --help: {doubled.group(0)!r}"
    lines = raw.split("\n")
    box = next(i for i, line in enumerate(lines) if re.sub(r"\W", "", line) == "options")
    description = "\n".join(lines[1:box])
    assert "\n\n\n" not in description, f"{path.name}: stray blank lines in --help"
    assert not re.search(r"^│\s+│$", raw, re.M), f"{path.name}: a blank line among the flags"
    shown = [" ".join(p.split()) for p in description.split("\n") if p.strip()]
    summary = [" ".join(p.split()) for p in signature(path).summary.split("\n\n")]
    assert shown == [p for p in summary if p], f"{path.name}: a paragraph broken in --help"


def test_callback_arguments_only_code_can_give_are_not_listed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``progress`` takes a rich ``Console`` from code: no ``--callback progress:console=``."""
    assert main(["callbacks", "progress"]) == 0
    out = capsys.readouterr().out
    assert "console" not in out.replace("baton.callbacks", "")
    assert "--callback progress:refresh_per_second=VALUE" in out
