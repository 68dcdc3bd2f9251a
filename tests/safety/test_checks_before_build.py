"""Checks before the build: a model that cannot load, a parallel layout that does not
divide the model, an ``--init-from`` that is no model are refused in one line with exit
status 2 before any framework builds a model, and a refused run leaves nothing behind
(no run directory, no lock file, no data cache)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .conftest import baton, snapshot

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "quickstart.py"
TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "32"]
TINY += ["--batch-size", "2", "--eval-every", "0", "--no-progress"]


def test_a_resume_into_another_shape_is_refused_before_the_build(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["run", str(QUICKSTART), "--run-dir", str(run_dir), *TINY, "--save-every", "2"]
    assert baton(capsys, *args, "--max-steps", "2")[0] == 0
    before = snapshot(run_dir)
    started = time.monotonic()
    status, said = baton(capsys, *args, "--max-steps", "4", "--resume", "auto", "--layers", "3")
    assert status == 2, said
    assert "holds a model built with layers 2, this run builds layers 3" in said
    assert "resume with --layers 2" in said and "Traceback" not in said
    assert time.monotonic() - started < 20  # refused before the backend builds anything
    assert snapshot(run_dir) == before


def test_a_refused_run_leaves_no_run_directory(tmp_path, capsys):
    """A callback that refuses at setup (a Freeze glob that matches nothing) stops the run
    after the backend built its model: what that run wrote goes with it."""
    run_dir = tmp_path / "new" / "run"
    argv = ["run", str(QUICKSTART), "--run-dir", str(run_dir), *TINY, "--max-steps", "2"]
    status, said = baton(capsys, *argv, "--callback", "freeze:patterns=[nothing.*]")
    assert status == 2 and "matches no parameter" in said, said
    assert not run_dir.exists()

    run_dir.mkdir(parents=True)  # a directory of the user's: only what this run made goes
    (run_dir / "notes.txt").write_text("mine")
    assert baton(capsys, *argv, "--callback", "freeze:patterns=[nothing.*]")[0] == 2
    assert (run_dir / "notes.txt").read_text() == "mine"
    assert not (run_dir / ".baton.lock").exists()


CASES = {
    "megatron --init-from a missing path": (
        "megatron_gpt_tiny.py",
        ["--init-from", "{tmp}/absent"],
        "--init-from {tmp}/absent does not exist; pass a Hugging Face model directory",
    ),
    "torchtitan --init-from a tokenizer directory": (
        "torchtitan_llama3_debug.py",
        ["--init-from", "{tmp}/tok"],
        "--init-from {tmp}/tok is a tokenizer directory (tokenizer.json, no config.json); "
        "pass a Hugging Face model directory",
    ),
    "torchtitan --tp 3 with 16 heads": (
        "torchtitan_llama3_debug.py",
        ["--tp", "3"],
        "--tp 3 does not divide the model's 16 attention heads; use a --tp that divides 16",
    ),
    "megatron --pp 3 with 2 layers": (
        "megatron_gpt_tiny.py",
        ["--pp", "3"],
        "--pp 3 does not divide the model's 2 layers",
    ),
    "megatron --data-path that is not there": (
        "megatron_gpt_tiny.py",
        ["--data-path", "{tmp}/absent/corpus"],
        "data path {tmp}/absent/corpus is neither a text file nor a prepared dataset",
    ),
    "maxtext --data-path a text file that is not there": (
        "maxtext_tiny.py",
        ["--data-path", "{tmp}/absent.txt"],
        "data_path '{tmp}/absent.txt' is not a file",
    ),
    "maxtext --tp 3 with 4 heads": (
        "maxtext_tiny.py",
        ["--tp", "3", "--dp-shard", "1"],
        "--tp 3 does not divide the model's 4 attention heads",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_before_the_build(name, tmp_path, capsys):
    recipe, flags, message = CASES[name]
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    run_dir = tmp_path / "runs" / "run"
    argv = ["run", str(RECIPES / recipe), "--run-dir", str(run_dir), "--max-steps", "1"]
    status, said = baton(capsys, *argv, *(f.format(tmp=tmp_path) for f in flags))
    assert status == 2, said
    assert message.format(tmp=tmp_path) in said and "Traceback" not in said
    assert not (tmp_path / "runs").exists()  # nor the folder the run directory was made in


def test_a_refused_megatron_run_leaves_no_data_cache(tmp_path, capsys):
    """Megatron indexes its byte corpus under the run directory while it builds; a run
    refused at setup (a Freeze glob that matches nothing) takes that away too."""
    run_dir = tmp_path / "run"
    argv = ["run", str(RECIPES / "megatron_gpt_tiny.py"), "--run-dir", str(run_dir)]
    argv += ["--max-steps", "1", "--eval-every", "0", "--no-progress"]
    status, said = baton(capsys, *argv, "--callback", "freeze:patterns=[nothing.*]")
    assert status == 2 and "matches no parameter" in said, said
    assert not run_dir.exists()


def test_a_refused_prepare_leaves_no_empty_output_folder(tmp_path, capsys):
    from baton.data import train_tokenizer
    from baton.tools.data.cli import main as data_main

    tok = train_tokenizer(tmp_path / "tok", vocab_size=300, texts=["def f(): pass\n" * 40])
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"body": "def f(): pass"}\n' * 3, encoding="utf-8")
    output = tmp_path / "new" / "deeper" / "corpus"
    argv = ["prepare", str(docs), "--tokenizer", str(tok.path), "--output", str(output)]
    assert data_main([*argv, "--workers", "1"]) == 2
    assert "has no key 'text'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
