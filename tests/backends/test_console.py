"""What a short run of each backend's tiny recipe prints: baton's own lines, nothing else.

Each recipe runs through the real CLI (``python -m baton.core.cli.command run``) in a fresh
process, its stdout and stderr captured together, without the progress bar. Every line
must be one of baton's: its log lines (``[HH:MM:SS] LEVEL message``, the format of
``baton.core.logs`` on a pipe), the step metrics and the final ``done:`` line. A
framework line fails the test unless ``LEFT_VISIBLE`` names it with its reason: the
quiet patches (``baton patches``) hide the framework notes that concern baton's code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: backend -> (recipe, extra flags)
RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "fabric": ("quickstart.py", ()),
    "torchtitan": ("torchtitan_llama3_debug.py", ()),
    # the distributed optimizer also has Megatron compute the parameter layout
    "megatron": ("megatron_gpt_tiny.py", ("--distributed-optimizer",)),
    "maxtext": ("maxtext_tiny.py", ()),
    "jax": ("jax_tiny.py", ()),
}

BATON_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
STEP_LINE = re.compile(r"^step +\d+ \| ")
DONE_LINE = re.compile(r"^done: step \d+, ")

#: framework lines deliberately left visible -> why the user should see them
LEFT_VISIBLE: dict[re.Pattern[str], str] = {
    re.compile(r"^Warmup \(\d+\) \+ decay \(\d+\) steps exceed total steps \(\d+\)\. "): (
        "TorchTitan shortens the LR decay to fit the run: the schedule the user asked for "
        "is not the one that runs"
    ),
}


def foreign_lines(output: str) -> list[str]:
    """The lines of ``output`` that baton did not choose to show."""
    return [
        line
        for line in output.splitlines()
        if line.strip()
        and not BATON_LOG_LINE.match(line)
        and not STEP_LINE.match(line)
        and not DONE_LINE.match(line)
        and not any(pattern.match(line) for pattern in LEFT_VISIBLE)
    ]


#: the summary of the patches a run applied (``baton.core.checkpoints.run_record.patch_summary``)
PATCH_SUMMARY = re.compile(r"^\[\d\d:\d\d:\d\d\] INFO +patches: \d+ applied", re.M)
#: one patch's line, shown at ``--verbose``
EACH_PATCH = re.compile(r"^\[\d\d:\d\d:\d\d\] DEBUG +patch \S+ +(applied|skipped) \(", re.M)


def baton(*args: str | Path, cwd: Path) -> str:
    """``python -m baton.core.cli.command ARGS`` in a fresh process, as a user's shell starts it;
    its stdout and stderr together (it must succeed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu", COLUMNS="300")
    env.pop("PYTHONWARNINGS", None)
    env.pop("BATON_PATCHES", None)
    # a user's shell, not this test process's: importing maxtext in-process (earlier
    # tests) sets TF_CPP_MIN_LOG_LEVEL=0 for the whole process, which turns on XLA's C++
    # INFO lines in every child
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-m", "baton.core.cli.command", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=900, cwd=cwd,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def run_recipe(recipe: str | Path, run_dir: Path, *flags: str, steps: int = 2) -> str:
    """Run ``recipe`` (a name under ``recipes/`` or a path) for ``steps`` steps without
    the progress bar; its stdout and stderr together."""
    path = ROOT / "recipes" / recipe if isinstance(recipe, str) else recipe
    if isinstance(recipe, str):
        flags = ("--no-progress", *flags)  # a test recipe has no progress bar to turn off
    argv = ["run", path, "--max-steps", str(steps), "--run-dir", run_dir, *flags]
    return baton(*argv, cwd=run_dir.parent)


def test_baton_log_lines_are_told_apart_from_framework_lines() -> None:
    output = "\n".join(
        [
            "[23:30:50] INFO    patch megatron_quiet                   applied (...)",
            "[23:30:50] WARNING resuming with max_steps changed from 3 to 6",
            "step      2 | loss 5.68 | grad_norm 3.316",
            "done: step 2, 1,024 tokens, 0.5 s (max_steps=2 reached); run dir /tmp/x",
            "GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes",
            "W1123 23:24:37.497000 4743 torch/utils/cpp_extension.py:178] No CUDA runtime",
            "Warmup (2) + decay (2) steps exceed total steps (2). Adjusting decay steps to 0.",
        ]
    )
    assert foreign_lines(output) == [
        "GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes",
        "W1123 23:24:37.497000 4743 torch/utils/cpp_extension.py:178] No CUDA runtime",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(RECIPES))
def test_a_tiny_run_prints_only_what_baton_chose_to_show(backend: str, tmp_path: Path) -> None:
    recipe, flags = RECIPES[backend]
    output = run_recipe(recipe, tmp_path / "run", *flags)
    assert foreign_lines(output) == [], output
    assert re.search(r"^done: step 2, ", output, re.M), output
    assert len(PATCH_SUMMARY.findall(output)) <= 1 and not EACH_PATCH.search(output), output


@pytest.mark.slow
def test_a_two_process_fabric_run_shows_no_process_group_banner(tmp_path: Path) -> None:
    """FabricConfig(devices=2) under plain ``baton run``: Lightning starts rank 1 itself
    and each rank joins the process group without Lightning's banner (``Initializing
    distributed: GLOBAL_RANK: ...``, rank 0's ``distributed_backend=gloo`` block)."""
    recipe = ROOT / "tests" / "backends" / "fabric" / "recipe_fabric_devices.py"
    output = run_recipe(recipe, tmp_path / "run")
    assert foreign_lines(output) == [], output
    assert re.search(r"^done: step 2, ", output, re.M), output


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
def test_a_resume_an_evaluation_and_an_export_print_no_framework_warning(
    backend: str, tmp_path: Path
) -> None:
    """Loading a checkpoint is where the frameworks warn (Megatron-Core's ShardedTensor
    and one-process DCP reads, TorchTitan's scheduler restore): a resume at ``--verbose``
    (each patch on its line), ``baton eval`` (with no resume message) and ``baton
    export`` show none of it."""
    from support.tiny_llama import save_tiny_llama

    recipe, _ = RECIPES[backend]
    run_dir = tmp_path / "run"
    # Megatron-Core exports runs built from a Hugging Face config
    flags = ("--init-from", str(save_tiny_llama(tmp_path / "hf"))) if backend == "megatron" else ()
    first = run_recipe(recipe, run_dir, *flags)
    assert len(PATCH_SUMMARY.findall(first)) == 1 and not EACH_PATCH.search(first), first
    resume = ("--resume", "auto", "--allow-changed", "max_steps", "--verbose")
    resumed = run_recipe(recipe, run_dir, *flags, *resume, steps=3)
    assert foreign_lines(resumed) == [], resumed
    assert "resumed from" in resumed and len(PATCH_SUMMARY.findall(resumed)) == 1, resumed
    assert re.search(rf"DEBUG +patch {backend}_quiet +applied \(", resumed), resumed
    checkpoint = run_dir / "checkpoints" / "latest"
    if backend == "megatron":  # (TorchTitan's evaluation needs its validator's data)
        evaluated = baton(
            "eval", ROOT / "recipes" / recipe, "--checkpoint", checkpoint, "--no-progress",
            cwd=tmp_path,
        )  # fmt: skip
        assert "resumed from" not in evaluated and "Warning" not in evaluated, evaluated
        assert re.search(r"^eval/loss \d", evaluated, re.M), evaluated
    exported = baton("export", checkpoint, "--format", "hf", tmp_path / "hf_out", cwd=tmp_path)
    assert exported.splitlines() == [
        f"exported the weights of {checkpoint} to {tmp_path / 'hf_out'} (Hugging Face format)"
    ], exported
