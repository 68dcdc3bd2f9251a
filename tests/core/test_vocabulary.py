"""Every recipe speaks one vocabulary: a parameter whose meaning is in
``baton.core.cli.vocabulary`` has the vocabulary's name and type, on every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.core.cli.recipe import build_driver
from baton.core.cli.recipe_signature import read_signature
from baton.core.cli.vocabulary import RENAMED, TERMS, VOCABULARY, check_parameter, markdown_table
from baton.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.py"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_uses_the_vocabulary(path: Path) -> None:
    signature = read_signature(path)
    assert signature is not None, f"{path.name}: its signature must be readable without import"
    problems = [
        f"{path.name}: {problem}"
        for param in signature.params
        if (problem := check_parameter(param.name, param.annotation, param.help)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_the_vocabulary_is_one_table() -> None:
    assert len(TERMS) == len(VOCABULARY), "a name is listed twice"
    assert not set(RENAMED) & set(TERMS), "a vocabulary name is also listed as an old name"
    table = markdown_table()
    assert all(f"`{term.flag}`" in table for term in VOCABULARY)
    assert check_parameter("micro_batch_size", int) == (
        "micro_batch_size means --batch-size (samples (sequences) per forward/backward pass "
        "on each data-parallel rank: the micro batch); name it batch_size"
    )
    assert check_parameter("tp", str) == "tp must be int (or int | None)"
    assert check_parameter("devices", int | None) is None
    assert check_parameter("save_every", int, "steps between checkpoints (0: none)") == (
        "save_every: its help must say what 0 means as everywhere: '(0: only when the run stops)'"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tp", "0"), "--tp must be >= 1, got 0"),
        (("--dp-shard", "-2"), "--dp-shard must be >= -1, got -2"),
        (("--save-every", "-1"), "--save-every must be >= 0, got -1"),
    ],
)
def test_vocabulary_bounds_are_checked_before_the_recipe_runs(
    flags: tuple[str, ...], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        build_driver(ROOT / "recipes" / "torchtitan_llama3_debug.py", [*flags, "--print-config"])
