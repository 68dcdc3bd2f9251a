"""Freeze and EMA under pipeline parallelism (PP 2 on 2 gloo ranks, from a tiny Hugging
Face Llama, on Megatron-Core and TorchTitan), given on the command line as a user gives
them: a pattern is checked against every stage's names, so each stage freezes what it
holds of it (layer 0's MLP on the first, the final norm on the last) and trains the rest;
EMA averages each stage's own pieces, and a resume gives them back (on TorchTitan with
no optimizer state saved for the parameters frozen from the first step); a
pattern no stage holds is refused on every rank alike, and the refused run leaves no run
directory behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import baton_rank_envs
from support.tiny_llama import save_tiny_llama
from support.torchrun import torchrun

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("pipeline_callbacks_worker.py")
FREEZE = "freeze:patterns=[model.layers.0.mlp.*,model.norm.weight]"
#: each engine's recipe and the flags that keep its run tiny
ENGINES = {
    "megatron": ("megatron_gpt_tiny.py", ["--no-async-save", "--eval-every", "0"]),
    "torchtitan": (
        "torchtitan_llama3_debug.py",
        ["--dp-shard", "1", "--seq-len", "64", "--batch-size", "2"],
    ),
}


def flags(engine: str, hf_dir: Path, run_dir: Path, steps: int, *more: str) -> list[str]:
    recipe, own = ENGINES[engine]
    return [
        str(ROOT / "recipes" / recipe), "--init-from", str(hf_dir), "--pp", "2",
        "--max-steps", str(steps), "--save-every", "2", "--log-every", "1", "--no-progress",
        "--run-dir", str(run_dir), *own, *more,
    ]  # fmt: skip


def per_rank(out: Path) -> list[dict]:
    return [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_freeze_and_ema_under_pipeline_parallelism(tmp_path, engine):
    pytest.importorskip("torchtitan" if engine == "torchtitan" else "megatron.core")
    hf_dir = save_tiny_llama(tmp_path / "hf")
    run_dir, out = tmp_path / "run", tmp_path / "seen"
    callbacks = ["--callback", FREEZE, "--callback", "ema:decay=0.5"]
    torchrun(WORKER, str(out), *flags(engine, hf_dir, run_dir, 2, *callbacks))
    first, last = per_rank(out)
    assert first["frozen"] == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert last["frozen"] == ["model.norm.weight"]
    assert not set(first["names"]) & set(last["names"])  # two stages, each its own layers
    for seen in (first, last):
        assert seen["flagged_frozen"] == seen["frozen"]
        assert seen["frozen_kept_others_moved"]
        assert seen["ema_names"] == seen["names"] and seen["ema_updates"] == 2
        assert seen["ema_differs_where_trained"]

    more = ("--resume", "auto", "--allow-changed", "max_steps", *callbacks)
    torchrun(WORKER, str(out), *flags(engine, hf_dir, run_dir, 3, *more))
    for before, seen in zip((first, last), per_rank(out), strict=True):
        assert seen["ema_names_at_start"] == before["names"]  # each stage's own averages
        assert seen["ema_updates_at_start"] == 2 and seen["ema_updates"] == 3
        assert seen["frozen"] == before["frozen"] and seen["frozen_kept_others_moved"]
        assert seen["ema_differs_where_trained"]


@pytest.mark.slow
def test_a_pattern_no_stage_holds_is_refused_on_every_rank(tmp_path):
    """The ranks are launched as separate processes (``BATON_RANK``, as SLURM does), so
    no launcher stops the second rank when the first exits: each says why on its own."""
    pytest.importorskip("megatron.core")
    hf_dir = save_tiny_llama(tmp_path / "hf")
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "baton.core.cli.command", "run",
        *flags("megatron", hf_dir, run_dir, 2, "--callback", "freeze:patterns=model.layers.9.*"),
    ]  # fmt: skip
    ranks = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for env in baton_rank_envs(2, {"COLUMNS": "200"})
    ]
    ended = [rank.communicate(timeout=600) for rank in ranks]
    refusal = "baton: Freeze: pattern 'model.layers.9.*' matches no parameter on any rank"
    for rank, (_, err) in zip(ranks, ended, strict=True):
        assert rank.returncode == 2, err[-3000:]
        assert refusal in err and "Traceback" not in err, err[-3000:]
    assert not run_dir.exists()  # no lock file, no data cache, no patch report
