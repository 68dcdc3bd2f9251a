"""Every user error is one short message naming the problem and the fix, with exit
status 2 (bad command, recipe or settings) or 1 (the run failed), no traceback, and
the run directory exactly as it was. Runs ``baton.core.cli.command.main`` in this process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from baton.core.checkpoints import files as ckpt
from baton.core.cli.command import main

from .conftest import RECIPE, snapshot

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.py"


def recipe_file(tmp: Path, body: str) -> str:
    path = tmp / "bad_recipe.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def data_file(tmp: Path, content: bytes) -> str:
    path = tmp / "data.txt"
    path.write_bytes(content)
    return str(path)


def prepared_prefix(tmp: Path) -> str:
    """A prefix with the two files ``baton data prepare`` writes (their content unread)."""
    for end in (".bin", ".idx"):
        (tmp / f"corpus{end}").write_bytes(b"\0" * 16)
    return str(tmp / "corpus")


@dataclass
class Case:
    #: argv after ``baton``, given (scratch dir, run dir)
    argv: Callable[[Path, Path], list[str]]
    status: int
    message: str
    env: dict[str, str] = field(default_factory=dict)
    #: what the run directory holds before: "none", "checkpoints" or "broken"
    state: str = "none"


def scalar(*extra: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, run: ["run", str(RECIPE), "--run-dir", str(run), *extra]


def quickstart(*extra: str, data: bytes | None = None) -> Callable[[Path, Path], list[str]]:
    def argv(tmp: Path, run: Path) -> list[str]:
        flags = ["--data-path", data_file(tmp, data)] if data is not None else []
        return ["run", str(QUICKSTART), "--run-dir", str(run), "--no-progress", *flags, *extra]

    return argv


def bad_recipe(body: str, *extra: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, run: ["run", recipe_file(tmp, body), "--run-dir", str(run), *extra]


DRIVER_RECIPE = """
from baton.core import Driver
from support.scalar_backend import ScalarBackend

def recipe(run_dir: str) -> Driver:
    return Driver(ScalarBackend(), run_dir=run_dir{extra})
"""

CASES: dict[str, Case] = {
    # the command line
    "no command": Case(lambda t, r: [], 2, "commands: run"),
    "unknown command": Case(lambda t, r: ["frobnicate"], 2, "unknown command 'frobnicate'"),
    "run without recipe": Case(lambda t, r: ["run"], 2, "usage: baton run RECIPE.py"),
    "missing recipe file": Case(
        lambda t, r: ["run", str(t / "nope.py")], 2, "does not exist (recipes live in"
    ),
    "unknown backend listed": Case(
        lambda t, r: ["patches", "--backend", "nope"], 2, "unknown backend 'nope'"
    ),
    "non-numeric value": Case(scalar("--max-steps", "many"), 2, "--max-steps"),
    "unknown flag": Case(scalar("--max-stepz", "5"), 2, "--max-stepz"),
    "negative step count": Case(scalar("--max-steps", "-5"), 2, "--max-steps must be >= 0"),
    "zero batch size": Case(scalar("--batch-size", "0"), 2, "--batch-size must be > 0, got 0"),
    "negative learning rate": Case(scalar("--lr", "-0.1"), 2, "--lr must be > 0"),
    "nan learning rate": Case(scalar("--lr", "nan"), 2, "--lr must be a finite number"),
    "zero log cadence": Case(scalar("--log-every", "0"), 2, "log_every must be >= 1, got 0"),
    "negative save cadence": Case(scalar("--save-every", "-1"), 2, "--save-every must be >= 0"),
    "unknown verify mode": Case(scalar("--verify", "fast"), 2, "verify='fast' is not one of"),
    "missing resume path": Case(
        lambda t, r: scalar("--resume", str(t / "gone"))(t, r), 2, "no checkpoint directory there"
    ),
    # recipes
    "recipe syntax error": Case(
        bad_recipe("def recipe(:\n    pass\n"), 2, "bad_recipe.py:1: syntax error"
    ),
    "recipe without function": Case(
        bad_recipe("def train():\n    pass\n"), 2, "no function named 'recipe'"
    ),
    "recipe import error": Case(
        bad_recipe("import not_a_module_anywhere\n"), 2, "cannot be imported: No module named"
    ),
    "recipe raises on load": Case(
        bad_recipe("raise RuntimeError('boom')\n"), 2, "raised RuntimeError while loading: boom"
    ),
    "parameter without type": Case(
        bad_recipe("def recipe(run_dir, steps=3):\n    pass\n"), 2, "needs a type annotation"
    ),
    "recipe returns no driver": Case(
        bad_recipe("def recipe(run_dir: str) -> int:\n    return 3\n"), 2, "not a Driver"
    ),
    "driver without limit": Case(
        bad_recipe(DRIVER_RECIPE.format(extra="")), 2, "set at least one of max_steps"
    ),
    "driver with negative tokens": Case(
        bad_recipe(DRIVER_RECIPE.format(extra=", max_tokens=-1")), 2, "max_tokens must be >= 0"
    ),
    "annotated bound": Case(
        bad_recipe(
            """
            from typing import Annotated
            from baton.core.cli.recipe import AtLeast

            def recipe(run_dir: str, layers: Annotated[int, AtLeast(2)] = 1) -> None:
                pass
            """
        ),
        2,
        "--layers must be >= 2, got 1",
    ),
    "lowest above peak learning rate": Case(
        bad_recipe(
            "def recipe(run_dir: str, lr: float = 1e-4, min_lr: float = 3e-4) -> None: pass"
        ),
        2,
        "--min-lr 0.0003 is above --lr 0.0001: it must be <= --lr",
    ),
    # data files
    "prepared prefix without tokenizer": Case(
        lambda t, r: quickstart("--data-path", prepared_prefix(t))(t, r),
        2,
        "is a prepared dataset (corpus.bin, corpus.idx): give the tokenizer it was prepared "
        "with, --tokenizer DIR",
    ),
    "missing data file": Case(
        lambda t, r: quickstart("--data-path", str(t / "no.txt"))(t, r), 2, "is not a file"
    ),
    # bad input found while the recipe builds its data: a usage error
    "empty data file": Case(quickstart(data=b""), 2, "data.txt' is empty; give a UTF-8"),
    "binary data file": Case(
        quickstart(data=bytes(range(256)) * 64), 2, "data.txt' is not UTF-8 text"
    ),
    # checkpoints
    "checkpoints without resume": Case(
        scalar(), 2, "already holds checkpoints (newest step_000006)", state="checkpoints"
    ),
    "every checkpoint broken": Case(
        scalar("--resume", "auto"), 1, "holds checkpoints but none can be loaded", state="broken"
    ),
    "unreadable checkpoint": Case(
        lambda t, r: scalar("--resume", str(r / "checkpoints" / "step_000006"))(t, r),
        1,
        "baton.json is unreadable",
        state="broken",
    ),
    "changed setting": Case(
        scalar("--resume", "auto", "--batch-size", "3"),
        2,
        "would change batch_size (2 -> 3)",
        state="checkpoints",
    ),
    "checkpoint of another setup": Case(
        scalar("--resume", "auto", "--lr", "0.5", "--allow-changed", "lr"),
        2,
        "was written by a different setup",
        state="checkpoints",
    ),
    "another recipe's run directory": Case(
        quickstart("--resume", "auto", "--allow-changed", "lr,max_steps,seq_len"),
        2,
        "belongs to another run (backend 'scalar', recipe ",
        state="checkpoints",
    ),
    "run dir is a file": Case(
        lambda t, r: scalar()(t, t / "file"), 2, "cannot create or lock the run directory"
    ),
    # environment
    "unknown patch name": Case(
        scalar(), 2, "unknown patch 'bogus' in BATON_PATCHES", env={"BATON_PATCHES": "bogus"}
    ),
    "non-integer BATON_RANK": Case(
        scalar(),
        2,
        "BATON_RANK='one' is not an integer",
        env={"BATON_RANK": "one", "BATON_WORLD_SIZE": "2"},
    ),
    "rank outside world": Case(
        scalar(), 2, "rank 5 is outside world size 2", env={"RANK": "5", "WORLD_SIZE": "2"}
    ),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run directory with checkpoints at steps 3 and 6 (copied per case)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(["run", str(RECIPE), "--run-dir", str(run_dir)]) == 0
    return run_dir


def prepare(state: str, trained: Path, run_dir: Path) -> None:
    import shutil

    if state == "none":
        return
    shutil.copytree(trained, run_dir, symlinks=True)
    if state == "broken":
        for checkpoint in ckpt.list_checkpoints(run_dir / "checkpoints"):
            (checkpoint / ckpt.META_FILE).write_text("{not json")


@pytest.mark.parametrize("name", list(CASES))
def test_user_error(name, tmp_path, trained, capsys, monkeypatch):
    case = CASES[name]
    run_dir = tmp_path / "run"
    (tmp_path / "file").write_text("not a directory")
    prepare(case.state, trained, run_dir)
    for key in ("RANK", "WORLD_SIZE", "BATON_RANK", "BATON_WORLD_SIZE", "BATON_PATCHES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("BATON_DEBUG", raising=False)
    argv = case.argv(tmp_path, run_dir)
    before = snapshot(run_dir)
    capsys.readouterr()
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == case.status, f"{name}: exit {status}\n{out}\n{err}"
    assert case.message in out + err, f"{name}: {case.message!r} not in\n{out}\n{err}"
    assert "Traceback" not in out + err, err
    assert snapshot(run_dir) == before, f"{name}: the run directory changed"
    if name == "another recipe's run directory":  # names the way out
        assert "recipe_scalar.py; this run: backend 'fabric', recipe " in err
        assert "give this run a new --run-dir" in err


def test_at_least_25_distinct_bad_inputs():
    assert len(CASES) >= 25
    assert len({c.message for c in CASES.values()}) == len(CASES)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_real_process_exit_status_and_debug_traceback(tmp_path):
    bad = recipe_file(tmp_path, "def recipe(:\n")
    plain = cli("run", bad)
    assert plain.returncode == 2 and "syntax error" in plain.stderr
    assert "Traceback" not in plain.stderr
    run_dir = tmp_path / "run"
    env = {"BATON_RANK": "x", "BATON_WORLD_SIZE": "2", "BATON_DEBUG": "1"}
    debug = cli("run", str(RECIPE), "--run-dir", str(run_dir), env=env)
    assert debug.returncode == 2, debug.stderr
    assert "Traceback" in debug.stderr and "BATON_RANK='x' is not an integer" in debug.stderr
    assert not run_dir.exists()  # the environment error left nothing behind
