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

from support.grpo_refusals import CASES as SHARED_CASES
from support.grpo_refusals import REWARD_CASES, base, grpo, refusal_assets
from support.grpo_refusals import refused as refused_by

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "hf_finetune.py"


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def assets(grpo_assets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return refusal_assets(grpo_assets["files"], tmp_path_factory.mktemp("fabric_grpo_refusals"))


def refused(capsys: pytest.CaptureFixture[str], run_dir: Path, args: list[str]) -> str:
    """The one line this recipe refuses ``args`` with (exit 2, no run directory)."""
    return refused_by(capsys, RECIPE, run_dir, args)


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
    **SHARED_CASES,
    "a group that does not divide the accumulated step": (
        ["--batch-size", "3", "--grad-accum", "2"],
        "--num-generations 4 does not divide the 6 rollouts of a step",
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


@pytest.mark.parametrize("reward", sorted(REWARD_CASES))
def test_a_failing_reward_is_refused_at_the_first_rollouts(assets, reward, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", grpo(assets, f"{assets['rewards']}:{reward}"))
    assert REWARD_CASES[reward] in line, line
