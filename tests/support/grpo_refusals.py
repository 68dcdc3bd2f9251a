"""What the GRPO refusal tests of every engine share: rewards that fail in each way, the
extra data (a tokenizer of its own, prepared conversations), the GRPO flags of a tiny
run, the settings that do not fit (each with the line that refuses it) and the check
that a run is refused in one line, exit status 2, with no run directory.

Example::

    assets = refusal_assets(grpo_assets["files"], tmp_path / "refusals")
    line = refused(capsys, RECIPE, tmp_path / "run", grpo(assets, "--num-generations", "1"))
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.core.cli.command import main

#: reward functions that raise, return too few values and return NaN
REWARDS = """
def raises(prompts, completions, completion_ids, **columns):
    raise ValueError("cannot score this")


def too_few(prompts, completions, completion_ids, **columns):
    return [1.0]


def not_a_number(prompts, completions, completion_ids, **columns):
    return [float("nan")] * len(completions)
"""

#: each failing reward of ``REWARDS`` -> what its refusal says
REWARD_CASES = {
    "raises": "raises raised ValueError: cannot score this on prompt",
    "too_few": "too_few returned 1 values for 8 completions",
    "not_a_number": "not_a_number returned NaN",
}

#: GRPO settings that do not fit the run -> (the flags, what the refusal says)
CASES = {
    "one generation": (["--num-generations", "1"], "--num-generations must be >= 2, got 1"),
    "a group that does not divide the step": (
        ["--batch-size", "6"],
        "--num-generations 4 does not divide the 6 rollouts of a step",
    ),
    "prompts longer than allowed": (
        ["--max-prompt-length", "10"],
        "are longer than --max-prompt-length 10 (the longest: 24 tokens",
    ),
    "rows too short": (
        ["--seq-len", "30"],
        "rows of 30 tokens cannot hold the longest prompt of",
    ),
}


def refusal_assets(files: dict[str, Path], root: Path) -> dict[str, Path]:
    """The GRPO ``files`` plus ``rewards`` (``REWARDS``), ``other`` (a tokenizer the
    prompts were not prepared with) and ``sft`` (prepared conversations), under ``root``."""
    from baton.data import train_tokenizer
    from support.posttrain import sft_prefix

    root.mkdir(parents=True, exist_ok=True)
    rewards = root / "rewards.py"
    rewards.write_text(REWARDS)
    other = train_tokenizer(root / "other", vocab_size=300, texts=["x = 1\n" * 50]).path
    sft = sft_prefix(root / "sft", files["tokenizer"], seq_len=40)
    return {**files, "rewards": rewards, "other": Path(other), "sft": sft}


def refused(
    capsys: pytest.CaptureFixture[str], recipe: Path, run_dir: Path, args: list[str]
) -> str:
    """The one line ``baton run recipe`` refuses ``args`` with (exit 2, no run directory)."""
    capsys.readouterr()
    status = main(["run", str(recipe), *args, "--run-dir", str(run_dir), "--no-progress"])
    said = capsys.readouterr()
    text = said.out + said.err
    lines = [line for line in said.err.splitlines() if line.startswith("baton:")]
    assert status == 2, text
    assert len(lines) == 1 and "Traceback" not in text, text
    assert not run_dir.exists()
    return lines[0]


def base(assets: dict[str, Path]) -> list[str]:
    """The flags every run of the tests shares: the tokenizer, the policy, one step."""
    return ["--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
            "--max-steps", "1", "--seq-len", "40"]  # fmt: skip


def grpo(assets: dict[str, Path], *reward: str) -> list[str]:
    """A tiny GRPO run's flags (``reward``: the ``--reward`` values; a length reward)."""
    return [
        "--objective", "grpo", "--data-path", str(assets["prepared"]),
        "--reward", *(reward or ("length:target=5",)), "--num-generations", "4",
        "--max-prompt-length", "24", "--max-completion-length", "8", "--batch-size", "8",
        *base(assets),
    ]  # fmt: skip
