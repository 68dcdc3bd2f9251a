"""Bad input to a GRPO run on MaxText, from the command line (``baton run
recipes/maxtext_tiny.py ...``): each is one line naming the problem and the fix, exit
status 2. What the recipe can see is refused before anything is built or written (the run
directory is not made): prompts given to sft or dpo, SFT or preference data given to
grpo, ``--num-generations 1``, rollouts per step that G does not divide, a prompt longer
than ``--max-prompt-length``, rows too short for a prompt and a completion, a tokenizer
other than the prompts'. A reward function that raises, returns the wrong number of
values or NaN is refused at the first step, when it first scores completions."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("maxtext")

from baton.core.cli.command import main
from support.grpo import grpo_flags
from support.maxtext_grpo import MAX_PROMPT, RECIPE, SEQ_LEN
from support.posttrain import preference_prefix, sft_prefix

#: reward functions that break each rule a reward must keep (TRL's signature)
BAD_REWARDS = """
def raises(prompts, completions, completion_ids, **columns):
    raise RuntimeError("the judge is down")


def short(prompts, completions, completion_ids, **columns):
    return [1.0]


def nan(prompts, completions, completion_ids, **columns):
    return [float("nan")] * len(completions)
"""


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], run_dir: Path) -> str:
    """Run ``baton run RECIPE argv``: exit status 2, one line on stderr (returned)."""
    status = main(["run", str(RECIPE), *argv, "--run-dir", str(run_dir), "--no-progress"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("baton:")]
    assert status == 2, lines
    assert len(lines) == 1, lines
    return lines[0]


def grpo(files: dict[str, Path], **settings: object) -> list[str]:
    settings = {"max_prompt_length": MAX_PROMPT, **settings}
    return [*grpo_flags(files, **settings), "--batch-size", "16", "--seq-len", str(SEQ_LEN)]


def test_what_the_recipe_sees_is_refused_before_anything_is_written(
    qwen3_grpo_assets, tmp_path, capsys
):
    from baton.data import train_tokenizer

    files = qwen3_grpo_assets["files"]
    run_dir = tmp_path / "run"
    tokenizer, policy = str(files["tokenizer"]), str(files["policy"])
    common = ["--tokenizer", tokenizer, "--init-from", policy, "--seq-len", "64"]
    prompts = str(files["prepared"])
    for objective in ("sft", "dpo"):
        line = refused(capsys, ["--objective", objective, "--data-path", prompts, *common], run_dir)
        assert "holds prompts data" in line and "--objective grpo" in line, line
    chat = sft_prefix(tmp_path / "chat", files["tokenizer"], 64, num_rows=2)
    pairs = preference_prefix(tmp_path / "pairs", files["tokenizer"], 64, num_rows=2)
    for prefix, kind in ((chat, "sft"), (pairs, "dpo")):
        flags = grpo(files)
        flags[flags.index("--data-path") + 1] = str(prefix)
        line = refused(capsys, flags, run_dir)
        assert f"--objective {kind}" in line and "--objective grpo reads prompt-only" in line, line
    line = refused(capsys, grpo(files, num_generations=1), run_dir)
    assert "--num-generations" in line and "2" in line, line
    line = refused(capsys, [*grpo(files), "--batch-size", "6"], run_dir)
    assert "--num-generations 4 does not divide the 6 rollouts" in line, line
    line = refused(capsys, grpo(files, max_prompt_length=8), run_dir)
    assert "longer than --max-prompt-length 8" in line, line
    line = refused(capsys, [*grpo(files), "--seq-len", "30"], run_dir)
    assert f"pass --seq-len {MAX_PROMPT + 10}" in line, line
    other = train_tokenizer(tmp_path / "other", vocab_size=300, texts=["x = 1\n" * 50]).path
    line = refused(capsys, [*grpo(files), "--tokenizer", str(other)], run_dir)
    assert "prepared with tokenizer" in line and "but this run uses" in line, line
    assert not run_dir.exists()


@pytest.mark.slow  # MaxText builds the run each time: the rewards first run at step 1
@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("raises", "raises raised RuntimeError: the judge is down on prompt"),
        ("short", "short returned 1 values for 16 completions"),
        ("nan", "nan returned NaN for"),
    ],
)
def test_a_bad_reward_stops_the_run_in_one_line(
    qwen3_grpo_assets, tmp_path, capsys, function, says
):
    rewards = tmp_path / "rewards.py"
    rewards.write_text(BAD_REWARDS)
    flags = [
        *grpo(qwen3_grpo_assets["files"]), "--reward", f"{rewards}:{function}",
        "--max-steps", "1", "--overrides", "dtype=float32",
    ]  # fmt: skip
    run_dir = tmp_path / "run"
    line = refused(capsys, flags, run_dir)
    assert says in line, line
    assert not (run_dir / "checkpoints").exists()
