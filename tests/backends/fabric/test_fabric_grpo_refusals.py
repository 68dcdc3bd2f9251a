"""Bad input to a Fabric GRPO run, from the command line (``baton run
recipes/hf_finetune.py ...`` in this process): each is refused in one line naming the
fix, exit status 2, and leaves no run directory. Prompts given to SFT or DPO and
conversations given to GRPO are refused by the data layer's check; the GRPO settings,
the prompts' length, the rows' length and the tokenizer before anything is built; a
reward function that raises, returns the wrong number of values or NaN on the first
rollouts, in the step that samples them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.core.cli.command import main

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "hf_finetune.py"

REWARDS = """
def raises(prompts, completions, completion_ids, **columns):
    raise ValueError("cannot score this")


def too_few(prompts, completions, completion_ids, **columns):
    return [1.0]


def not_a_number(prompts, completions, completion_ids, **columns):
    return [float("nan")] * len(completions)
"""

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def assets(grpo_assets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from baton.data import train_tokenizer
    from support.posttrain import sft_prefix

    files = grpo_assets["files"]
    root = tmp_path_factory.mktemp("fabric_grpo_refusals")
    rewards = root / "rewards.py"
    rewards.write_text(REWARDS)
    other = train_tokenizer(root / "other", vocab_size=300, texts=["x = 1\n" * 50]).path
    sft = sft_prefix(root / "sft", files["tokenizer"], seq_len=40)
    return {**files, "rewards": rewards, "other": Path(other), "sft": sft}


def refused(capsys: pytest.CaptureFixture[str], run_dir: Path, args: list[str]) -> str:
    """The one line ``baton run`` refuses ``args`` with (exit 2, no run directory)."""
    capsys.readouterr()
    status = main(["run", str(RECIPE), *args, "--run-dir", str(run_dir), "--no-progress"])
    said = capsys.readouterr()
    text = said.out + said.err
    lines = [line for line in said.err.splitlines() if line.startswith("baton:")]
    assert status == 2, text
    assert len(lines) == 1 and "Traceback" not in text, text
    assert not run_dir.exists()
    return lines[0]


def base(assets: dict[str, Path]) -> list[str]:
    return ["--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
            "--max-steps", "1", "--seq-len", "40"]  # fmt: skip


def grpo(assets: dict[str, Path], *reward: str) -> list[str]:
    return [
        "--objective", "grpo", "--data-path", str(assets["prepared"]),
        "--reward", *(reward or ("length:target=5",)), "--num-generations", "4",
        "--max-prompt-length", "24", "--max-completion-length", "8", "--batch-size", "8",
        *base(assets),
    ]  # fmt: skip


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_prompts_are_refused_by_sft_and_dpo(assets, objective, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", [
        "--objective", objective, "--data-path", str(assets["prepared"]), *base(assets)])  # fmt: skip
    assert "holds prompts data (prepared for --objective grpo)" in line
    assert f"--objective {objective} reads" in line


def test_conversations_are_refused_by_grpo(assets, capsys, tmp_path):
    args = grpo(assets)
    args[args.index("--data-path") + 1] = str(assets["sft"])
    line = refused(capsys, tmp_path / "run", args)
    assert "holds sft data" in line and "--objective grpo reads prompt-only records" in line


CASES = {
    "one generation": (["--num-generations", "1"], "--num-generations must be >= 2, got 1"),
    "a group that does not divide the step": (
        ["--batch-size", "6"],
        "--num-generations 4 does not divide the 6 rollouts of a step",
    ),
    "a group that does not divide the accumulated step": (
        ["--batch-size", "3", "--grad-accum", "2"],
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


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpo_settings_that_do_not_fit_are_refused(assets, case, capsys, tmp_path):
    extra, message = CASES[case]
    assert message in refused(capsys, tmp_path / "run", [*grpo(assets), *extra])


def test_a_tokenizer_other_than_the_prompts_is_refused(assets, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", [*grpo(assets), "--tokenizer", str(assets["other"])])
    assert "was prepared with tokenizer" in line and "pass the same tokenizer" in line


def test_a_kl_term_without_a_hugging_face_reference_is_refused(assets, capsys, tmp_path):
    """From a checkpoint (no Hugging Face directory to score the rollouts under) a KL
    term needs ``--reference``."""
    from baton.core.cli.command import main as baton

    start = tmp_path / "start"
    args = [*grpo(assets), "--run-dir", str(start), "--no-progress", "--save-every", "1"]
    assert baton(["run", str(RECIPE), *args]) == 0
    checkpoint = start / "checkpoints" / "step_000001"
    args = [*grpo(assets), "--beta", "0.04", "--model-config", str(assets["policy"])]
    args[args.index("--init-from") + 1] = str(checkpoint)
    line = refused(capsys, tmp_path / "run", args)
    assert "--beta above 0 scores the rollouts under a reference model" in line
    assert "pass --reference HF_DIR" in line


REWARD_CASES = {
    "raises": "raises raised ValueError: cannot score this on prompt",
    "too_few": "too_few returned 1 values for 8 completions",
    "not_a_number": "not_a_number returned NaN",
}


@pytest.mark.parametrize("reward", sorted(REWARD_CASES))
def test_a_failing_reward_is_refused_at_the_first_rollouts(assets, reward, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", grpo(assets, f"{assets['rewards']}:{reward}"))
    assert REWARD_CASES[reward] in line, line
