"""Bad input to a TorchTitan GRPO run, from the command line (``baton run
recipes/torchtitan_llama3_debug.py ...`` in this process): each is refused in one line
naming the fix, exit status 2, and leaves no run directory. Prompts given to SFT or DPO
and conversations given to GRPO are refused by the data layer's check; the GRPO settings,
the prompts' length, the rows' length and the tokenizer before anything is built; a
reward function that raises, returns the wrong number of values or NaN on the first
rollouts, in the step that samples them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from support.grpo_refusals import CASES as SHARED_CASES
from support.grpo_refusals import REWARD_CASES, base, grpo, refusal_assets
from support.grpo_refusals import refused as refused_by

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"


@pytest.fixture(scope="module")
def assets(grpo_assets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return refusal_assets(grpo_assets["files"], tmp_path_factory.mktemp("titan_grpo_refusals"))


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


CASES = SHARED_CASES


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpo_settings_that_do_not_fit_are_refused(assets, case, capsys, tmp_path):
    extra, message = CASES[case]
    assert message in refused(capsys, tmp_path / "run", [*grpo(assets), *extra])


def test_a_tokenizer_other_than_the_prompts_is_refused(assets, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", [*grpo(assets), "--tokenizer", str(assets["other"])])
    assert "was prepared with tokenizer" in line and "pass the same tokenizer" in line


def test_the_debug_model_without_a_hugging_face_form_is_refused(assets, capsys, tmp_path):
    args = grpo(assets)
    at = args.index("--init-from")
    del args[at : at + 2]
    line = refused(capsys, tmp_path / "run", args)
    assert "start from --init-from HF_DIR" in line


@pytest.mark.parametrize("reward", sorted(REWARD_CASES))
def test_a_failing_reward_is_refused_at_the_first_rollouts(assets, reward, capsys, tmp_path):
    line = refused(capsys, tmp_path / "run", grpo(assets, f"{assets['rewards']}:{reward}"))
    assert REWARD_CASES[reward] in line, line
