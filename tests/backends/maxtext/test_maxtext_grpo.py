"""GRPO on MaxText (``recipes/maxtext_tiny.py --objective grpo``), through MaxText's own
jitted ``train_step``: on the fixed rollouts of ``support.grpo`` (replayed by ``--generator
recorded:``), the first step's loss, gradient norm and TRL's metrics equal TRL's
``GRPOTrainer`` for ``dapo`` and ``grpo``, beta 0 and 0.04, and with ``--num-iterations
2`` the second step (ratios away from 1) equals TRL's second; the weights
``gather_weights()`` hands the generator are those ``baton export`` writes and
``transformers`` loads; EMA's averages follow the trained weights; a resumed run
continues bit for bit. The policy is a tiny Qwen3 (``qwen3_grpo_assets``: MaxText's
Llama folds the attention scale into its query kernel, so its gradients are not Hugging
Face's)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("maxtext")

from safetensors.numpy import load_file

from baton.callbacks import EMA
from baton.core.checkpoints.files import read_meta
from support.grpo import LEARNING_STEPS, learned, learning_flags, read_rollouts
from support.maxtext_grpo import (
    FP32,
    MAX_PROMPT,
    TRL_OPTIMIZER,
    GatheredWeights,
    constant_lr,
    grpo_argv,
    run_grpo,
)
from support.resilience import StepWeights, check_ema

#: TRL's metrics of the loss that a step logs under the same names
LOSS_METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
#: TRL's metrics of the rollouts that a step logs under the same names
ROLLOUT_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length")


def assert_equals_trl(
    step: dict[str, float], trl: dict[str, float], beta: float, kl_rel: float = 1e-5
) -> None:
    """A step's loss and gradient norm within 1e-5 of TRL's (absolute 1e-7 where TRL's
    loss is 0: grpo's at ratio 1), its loss metrics as TRL logs them (``kl`` within
    ``kl_rel``)."""
    compared = ("loss", "grad_norm", *LOSS_METRICS, *(("kl",) if beta else ()))
    print(" ".join(f"{n}: maxtext {step[n]!r} trl {trl[n]!r};" for n in compared))
    assert step["loss"] == pytest.approx(trl["loss"], rel=1e-5, abs=1e-7)
    assert step["grad_norm"] == pytest.approx(trl["grad_norm"], rel=1e-5)
    for name in LOSS_METRICS:
        assert step[name] == pytest.approx(trl[name], rel=1e-5, abs=1e-7), name
    if beta:
        assert step["kl"] == pytest.approx(trl["kl"], rel=kl_rel, abs=1e-7)
    assert ("kl" in step) == bool(beta)
    for name in ROLLOUT_METRICS:  # TRL logs them on the steps that sample
        if name in trl:
            assert step[name] == pytest.approx(trl[name], rel=1e-6), name


@pytest.mark.parametrize(
    ("loss_type", "beta"),
    [
        ("dapo", 0.0),
        pytest.param("grpo", 0.0, marks=pytest.mark.slow),
        pytest.param("dapo", 0.04, marks=pytest.mark.slow),
    ],
)
def test_first_step_equals_trl(qwen3_grpo_assets, tmp_path, loss_type, beta):
    files = qwen3_grpo_assets["files"]
    argv = grpo_argv(
        files, tmp_path / "run", loss_type=loss_type, beta=beta,
        extra=("--save-every", "0", "--no-callback", "checkpoint"),
    )  # fmt: skip
    _, logged = run_grpo(argv)
    trl = qwen3_grpo_assets["reference"](loss_type=loss_type, beta=beta)
    assert_equals_trl(logged.metrics[1], trl[0], beta)
    assert logged.metrics[1]["timing/generation_s"] >= 0.0


@pytest.fixture(scope="module")
def two_iterations(qwen3_grpo_assets, tmp_path_factory):
    """grpo at beta 0.04 with --num-iterations 2: two steps on the one batch of rollouts,
    a checkpoint after each, EMA (decay 0.5) and the weights after each step, by
    ``model_state`` and by ``gather_weights``."""
    run_dir = tmp_path_factory.mktemp("grpo-mu2") / "run"
    argv = grpo_argv(
        qwen3_grpo_assets["files"], run_dir, steps=2, loss_type="grpo", beta=0.04,
        num_iterations=2, extra=("--save-every", "1", "--no-async-save"),
    )  # fmt: skip
    ema, weights, gathered = EMA(decay=0.5), StepWeights(), GatheredWeights()
    _, logged = run_grpo(argv, ema, weights, gathered)
    return {
        "run_dir": run_dir,
        "argv": argv,
        "metrics": logged.metrics,
        "ema": ema.averages,
        "weights": weights,
        "gathered": gathered.values,
    }


def test_two_iterations_equal_trls_steps(qwen3_grpo_assets, two_iterations):
    """The first step at ratio 1 and the second, on the same rollouts after one update
    (tokens clipped: region_mean > 0), equal TRL's; the rollouts are sampled once."""
    trl = qwen3_grpo_assets["reference"](loss_type="grpo", beta=0.04, steps=2, num_iterations=2)
    metrics = two_iterations["metrics"]
    assert_equals_trl(metrics[1], trl[0], beta=0.04)
    assert metrics[2]["clip_ratio/region_mean"] > 0
    # after one update the policy's log-probabilities differ from TRL's by ~1e-6 (Adam
    # divides tiny gradients by eps: the two frameworks' rounding shows), which k3's
    # exp(d) - d - 1 amplifies: the KL within 1e-4
    assert_equals_trl(metrics[2], trl[1], beta=0.04, kl_rel=1e-4)
    assert metrics[2]["timing/generation_s"] == 0.0  # the batch is reused
    records = read_rollouts(two_iterations["run_dir"] / "logs" / "rollouts.jsonl")
    fixed = read_rollouts(qwen3_grpo_assets["files"]["rollouts"])
    assert sorted(r["completion_ids"] for r in records) == sorted(
        r["completion_ids"] for r in fixed
    )  # every completion once (in the prompt order's order)
    assert {r["step"] for r in records} == {1}


def test_gathered_weights_are_the_exports_and_ema_follows_them(qwen3_grpo_assets, two_iterations):
    """``gather_weights()`` after each step: the names, shapes and values ``baton export``
    writes from that step's checkpoint (and the ``model_state`` names' values); the
    export loads in ``transformers`` with the trained weights; EMA through
    ``model_state`` averages them."""
    import torch
    from transformers import AutoModelForCausalLM

    from baton.tools.export import main as export

    weights, gathered = two_iterations["weights"], two_iterations["gathered"]
    start = load_file(str(qwen3_grpo_assets["files"]["policy"] / "model.safetensors"))
    for step in (1, 2):
        checkpoint = two_iterations["run_dir"] / "checkpoints" / f"step_{step:06d}"
        out = two_iterations["run_dir"].parent / f"export-{step}"
        assert export([str(checkpoint), str(out), "--format", "hf"]) == 0
        exported = load_file(str(out / "model.safetensors"))
        assert sorted(gathered[step]) == sorted(exported) == sorted(start)
        for name, value in exported.items():
            assert gathered[step][name].shape == value.shape, name
            np.testing.assert_array_equal(gathered[step][name], value, err_msg=name)
            np.testing.assert_allclose(
                weights.values[step][name], value, rtol=1e-6, atol=1e-7, err_msg=name
            )
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    loaded = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    for name, value in gathered[2].items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    moved = [n for n in start if not np.allclose(gathered[2][n], start[n], rtol=0, atol=1e-6)]
    assert len(moved) > len(start) // 2  # trained: not the starting weights
    check_ema(weights, two_iterations["ema"], decay=0.5)


@pytest.mark.slow
def test_a_resumed_run_continues_bit_for_bit(two_iterations, tmp_path):
    """Resumed after step 1 (its checkpoint holds the rollouts step 2 trains on again),
    step 2 logs the uninterrupted run's loss and reaches its weights, bit for bit."""
    checkpoint = two_iterations["run_dir"] / "checkpoints" / "step_000001"
    argv = [*two_iterations["argv"], "--resume", str(checkpoint)]
    run_dir = argv.index("--run-dir") + 1
    argv[run_dir] = str(tmp_path / "resumed")
    gathered = GatheredWeights()
    _, logged = run_grpo(argv, gathered)
    assert sorted(logged.metrics) == [2]
    whole = two_iterations["metrics"][2]
    for name in ("loss", "grad_norm", "kl", "clip_ratio/region_mean", "reward"):
        assert logged.metrics[2][name] == whole[name], name
    for name, value in two_iterations["gathered"][2].items():
        np.testing.assert_array_equal(gathered.values[2][name], value, err_msg=name)
    state = read_meta(checkpoint)["rollouts"]
    assert state["batch"]["sampled_at"] == 1


@pytest.mark.slow
def test_the_policy_learns_a_reward(qwen3_grpo_assets, tmp_path):
    """``support.grpo``'s learning task, sampled each step by the transformers generator
    from the weights MaxText trains: the mean reward of the last five steps beats the
    first five's by the stated margin."""
    import time

    files = qwen3_grpo_assets["files"]
    argv = [
        *learning_flags(files, max_prompt_length=MAX_PROMPT), "--batch-size", "16",
        *constant_lr(5e-3), "--seq-len", str(MAX_PROMPT + 8), "--log-every", "1",
        "--save-every", "0", "--no-callback", "checkpoint", "--run-dir", str(tmp_path / "run"),
        "--no-progress", "--overrides", *FP32, *TRL_OPTIMIZER,
    ]  # fmt: skip
    started = time.perf_counter()
    _, logged = run_grpo(argv)
    seconds = time.perf_counter() - started
    rewards = [logged.metrics[step]["reward"] for step in sorted(logged.metrics)]
    print(f"rewards {[round(r, 3) for r in rewards]}; {seconds:.1f} s")
    assert len(rewards) == LEARNING_STEPS
    assert learned(rewards), rewards
