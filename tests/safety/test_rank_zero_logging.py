"""Rank-zero logging: under torchrun or SLURM only rank 0 logs at INFO; other ranks show
warnings and errors, prefixed with their rank."""

from __future__ import annotations

import logging
import sysconfig
from pathlib import Path

from baton.core.cli.command import main
from baton.core.launch import Launch
from baton.core.logs import own_code, setup_logging

from .conftest import RECIPE


def test_other_ranks_show_only_warnings_with_their_rank(capsys):
    logger = setup_logging(Launch(rank=3, world_size=4, source="torchrun"))
    logger.info("checkpoint saved")
    logger.warning("sink failed")
    out = capsys.readouterr().out
    assert "checkpoint saved" not in out
    assert "[rank 3] sink failed" in out


def test_rank_zero_logs_everything_unprefixed(capsys):
    logger = setup_logging(Launch())
    logger.info("checkpoint saved")
    out = capsys.readouterr().out
    assert "checkpoint saved" in out and "[rank" not in out


def run(capsys, run_dir) -> str:
    capsys.readouterr()
    assert main(["run", str(RECIPE), "--run-dir", str(run_dir), "--max-steps", "3"]) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_under_torchrun_only_rank_zero_logs_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert "saved" in run(capsys, tmp_path / "r0")
    monkeypatch.setenv("RANK", "1")
    rank_one = run(capsys, tmp_path / "r1")
    assert "saved" not in rank_one and "done" not in rank_one, rank_one


def test_a_recipes_own_logger_prints_at_info_on_rank_zero(tmp_path, capsys, monkeypatch):
    """``logging.getLogger("my_recipe").info(...)`` in a recipe shows like baton's lines;
    libraries' INFO records stay quiet and their warnings still reach stderr."""
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        RECIPE.read_text()
        .replace("from __future__ import annotations", "import logging")
        .replace('    """Gradient descent on a scalar, saved every few steps."""', (
            '    """Gradient descent on a scalar, saved every few steps."""\n'
            '    logging.getLogger("my_recipe").info("building the scalar model")'
        ))
    )  # fmt: skip
    capsys.readouterr()
    assert main(["run", str(recipe), "--run-dir", str(tmp_path / "r0"), "--max-steps", "2"]) == 0
    assert "building the scalar model" in capsys.readouterr().out

    library = Path(sysconfig.get_paths()["purelib"]) / "somelib" / "core.py"
    info = logging.LogRecord("somelib", logging.INFO, str(library), 1, "chatter", None, None)
    warning = logging.LogRecord("somelib", logging.WARNING, str(library), 1, "beware", None, None)
    assert not own_code(info) and own_code(logging.makeLogRecord({"pathname": str(recipe)}))
    logging.getLogger().handle(info)
    logging.getLogger().handle(warning)
    captured = capsys.readouterr()
    assert "chatter" not in captured.out + captured.err and "beware" in captured.err

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["run", str(recipe), "--run-dir", str(tmp_path / "r1"), "--max-steps", "2"]) == 0
    assert "building the scalar model" not in capsys.readouterr().out
