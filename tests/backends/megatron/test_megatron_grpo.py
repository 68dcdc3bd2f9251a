"""GRPO on Megatron-Core (recipes/megatron_gpt_tiny.py --objective grpo): the rollout
phase's rows through Megatron's own step (its schedule over this rank's micro-batches of
the step's rollouts, its per-token loss normalisation, its AdamW), against TRL's
``GRPOTrainer`` trained on the same fixed rollouts (``support.grpo``: the completions
replayed by ``--generator recorded:FILE``, scored by the recorded rewards).

Megatron's optimizer is made TRL's: AdamW with betas (0.9, 0.999), eps 1e-8, no weight
decay, clipping at 1.0 and a constant learning rate (``TRL_OPTIMIZER``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from baton.core import Callback
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver
from support.grpo import grpo_flags, learned, learning_flags

sys.path.insert(0, str(Path(__file__).parent))
from grpo_worker import GATHERED, METRICS, GRPOOutputs, run

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
WORKER = Path(__file__).with_name("grpo_worker.py")
#: the fixture's longest prompt, and rows that hold it and the longest completion (10)
PROMPT_LENGTH, SEQ_LEN = 24, 40
#: Megatron's optimizer and schedule as TRL's GRPOTrainer runs them
TRL_OPTIMIZER = (
    "--warmup-steps", "0", "--set", "decay_style=constant",
    "--set", "optimizer.adam_beta1=0.9", "--set", "optimizer.adam_beta2=0.999",
    "--set", "optimizer.adam_eps=1.0e-8", "--set", "optimizer.weight_decay=0",
    "--set", "optimizer.clip_grad=1.0",
)  # fmt: skip
#: TRL's metrics of the loss each step must equal (``kl`` with a KL term)
LOSS_METRICS = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
#: TRL's metrics of the rollouts
ROLLOUT_METRICS = (
    "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
    "completions/min_length", "completions/max_length", "completions/clipped_ratio",
)  # fmt: skip


def grpo_argv(
    files: dict[str, Path], run_dir: Path, *extra: str, steps: int = 1, **settings: Any
) -> list[str]:
    """A run on the fixed rollouts (every prompt's group in one step of 16 rows)."""
    return [
        *grpo_flags(files, **{"max_prompt_length": PROMPT_LENGTH, **settings}),
        "--batch-size", "16", "--global-batch-size", "16", "--max-steps", str(steps),
        "--log-every", "1", "--lr", "1e-3", "--seq-len", str(SEQ_LEN), *TRL_OPTIMIZER,
        "--save-every", "0", "--no-async-save", "--no-progress", "--run-dir", str(run_dir),
        *extra,
    ]  # fmt: skip


def close(expected: float, rel: float = 1e-5) -> Any:
    """Within ``rel`` relative (an absolute 1e-7 where TRL's value is 0)."""
    return pytest.approx(expected, rel=rel, abs=1e-7)


#: the k3 KL, ``exp(d) - d - 1`` of ``d = ref - logp`` (about 0.2 here), is the metric
#: most sensitive to float32 rounding: a change ``e`` of the log-probabilities moves it by
#: about ``2 e / d`` relative. Two engines' log-probabilities a float32 ulp apart (5e-7 at
#: 6 nats) give KLs 1e-5 apart; and after a first Adam step, whose update is
#: ``lr * g / (|g| + eps)``, the rounding of tiny gradients moves some weights by a good
#: part of ``lr``, so two layouts' second-step KLs are up to 1e-4 apart (relative)
KL_TOLERANCE, KL_LAYOUT_TOLERANCE = 1e-4, 1e-3


def check_step(got: dict[str, float], trl: dict[str, float], *, beta: float) -> None:
    """A step's loss, gradient norm and metrics equal TRL's logged step (the rollout
    metrics where TRL logs them: on the steps that sample)."""
    assert got["loss"] == close(trl["loss"]), (got["loss"], trl["loss"])
    assert got["grad_norm"] == close(trl["grad_norm"]), (got["grad_norm"], trl["grad_norm"])
    rollouts = tuple(name for name in ROLLOUT_METRICS if name in trl)
    for name in (*LOSS_METRICS, *rollouts):
        assert got[name] == close(trl[name]), (name, got[name], trl[name])
    assert ("kl" in got) == bool(beta)
    if beta:
        assert got["kl"] == close(trl["kl"], KL_TOLERANCE), (got["kl"], trl["kl"])


@pytest.mark.parametrize(
    ("loss_type", "beta"),
    [
        ("dapo", 0.0),
        pytest.param("dapo", 0.04, marks=pytest.mark.slow),
        pytest.param("grpo", 0.0, marks=pytest.mark.slow),
        pytest.param("grpo", 0.04, marks=pytest.mark.slow),
    ],
)
def test_first_step_equals_trl(grpo_assets, tmp_path, loss_type, beta):
    """The first step on the fixed rollouts: loss, gradient norm, entropy, clip ratios,
    KL and the rollout metrics equal TRL's GRPOTrainer's (one micro-batch of 16 rows)."""
    files = grpo_assets["files"]
    argv = grpo_argv(files, tmp_path / "run", loss_type=loss_type, beta=beta)
    got = run(tmp_path / "out", str(RECIPE), argv).metrics[1]
    trl = grpo_assets["reference"](loss_type=loss_type, beta=beta)
    check_step(got, trl[0], beta=beta)


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_second_step_of_two_iterations_equals_trl(grpo_assets, tmp_path, beta):
    """mu = 2: the second step trains the same rollouts again with the updated policy
    (ratios away from 1: some clipped; with a KL term, the policy away from the reference,
    the starting weights: kl > 0), in two micro-batches of 8 rows; both steps equal
    TRL's."""
    files = grpo_assets["files"]
    argv = grpo_argv(
        files, tmp_path / "run", "--batch-size", "8", steps=2, num_iterations=2, beta=beta
    )
    got = run(tmp_path / "out", str(RECIPE), argv).metrics
    trl = grpo_assets["reference"](loss_type="dapo", beta=beta, steps=2, num_iterations=2)
    assert got[2]["clip_ratio/region_mean"] > 0
    if beta:
        assert got[2]["kl"] > 0
    for step in (1, 2):
        check_step(got[step], trl[step - 1], beta=beta)


@pytest.mark.slow
def test_first_steps_under_tensor_parallel_2_equal_one_rank(grpo_assets, tmp_path):
    """Two gloo ranks under tensor parallel 2 (each a half of the vocabulary's logits,
    rank 0 scoring the reference and broadcasting the rows, the weights gathered from
    both halves) give the single rank's first step on the fixed rollouts, and its second
    (mu = 2: ratios away from 1, a KL term away from 0)."""
    from support.torchrun import torchrun

    files = grpo_assets["files"]
    settings: dict[str, Any] = {"beta": 0.04, "num_iterations": 2, "steps": 2}
    single = run(tmp_path / "one", str(RECIPE), grpo_argv(files, tmp_path / "r1", **settings))
    argv = grpo_argv(files, tmp_path / "r2", "--tp", "2", **settings)
    torchrun(WORKER, str(tmp_path / "tp2"), str(RECIPE), *argv)
    logged = json.loads((tmp_path / "tp2" / METRICS).read_text())
    assert single.metrics[2]["kl"] > 0
    for step in (1, 2):
        got, want = logged[str(step)], single.metrics[step]
        for name in ("loss", "grad_norm", *LOSS_METRICS):
            assert got[name] == close(want[name]), (step, name, got[name], want[name])
        assert got["kl"] == close(want["kl"], KL_LAYOUT_TOLERANCE), (step, got["kl"], want["kl"])


@pytest.mark.slow
def test_the_policy_learns_the_task(grpo_assets, tmp_path):
    """The learning task (``support.grpo.learning_flags``): rollouts sampled by the
    transformers generator from the weights Megatron trains, rewarded for words starting
    with a vowel; the mean reward rises by the stated margin within the steps."""
    files = grpo_assets["files"]
    argv = [
        *learning_flags(files, max_prompt_length=PROMPT_LENGTH),
        "--batch-size", "16", "--global-batch-size", "16", "--lr", "5e-3",
        "--seq-len", str(SEQ_LEN), *TRL_OPTIMIZER, "--log-every", "1", "--save-every", "0",
        "--no-async-save", "--no-progress", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    started = time.perf_counter()
    logged = run(tmp_path / "out", str(RECIPE), argv).metrics
    wall = time.perf_counter() - started
    rewards = [logged[step]["reward"] for step in sorted(logged)]
    print(f"rewards {[round(r, 3) for r in rewards]} in {wall:.1f} s")
    assert learned(rewards), rewards
    assert all(logged[step]["timing/weight_sync_s"] > 0 for step in logged)


class StopAfter(Callback):
    """Save and stop after ``step`` (a run cut short, to be resumed)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, driver: Any, output: Any) -> None:
        if driver.step == self.step:
            driver.control.request_save("test")
            driver.control.request_stop("test")


@pytest.mark.slow
def test_a_resumed_run_reaches_the_uninterrupted_runs_weights_bit_for_bit(grpo_assets, tmp_path):
    """A GRPO run sampling with the transformers generator, stopped after step 2 (its
    checkpoint holds Megatron's state and the rollout phase's: prompt order, sampler) and
    resumed, samples the same completions and ends with the same weights, bit for bit,
    as a run that never stopped."""
    import torch
    from safetensors.torch import load_file

    files = grpo_assets["files"]

    def run_to(run_dir: Path, out: Path, *extra: str, stop: int = 0) -> dict[int, Any]:
        argv = [
            *learning_flags(files, max_prompt_length=PROMPT_LENGTH), "--max-steps", "4",
            "--batch-size", "8", "--global-batch-size", "16", "--lr", "5e-3",
            "--seq-len", str(SEQ_LEN), *TRL_OPTIMIZER, "--log-every", "1",
            "--save-every", "0", "--no-async-save", "--no-progress", "--run-dir", str(run_dir),
            *extra,
        ]  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        driver = build_driver(RECIPE, argv)
        assert driver is not None
        outputs = GRPOOutputs(out)
        driver.callbacks += [outputs, StopAfter(stop)] if stop else [outputs]
        driver.fit()
        return outputs.metrics

    straight = run_to(tmp_path / "straight", tmp_path / "a")
    run_to(tmp_path / "cut", tmp_path / "b", stop=2)
    resumed = run_to(tmp_path / "cut", tmp_path / "c", "--resume", "auto")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for name in ("loss", "grad_norm", "reward"):
            assert resumed[step][name] == straight[step][name], (step, name)
    records = [
        (tmp_path / run / "logs" / "rollouts.jsonl").read_text() for run in ("straight", "cut")
    ]
    assert records[0] == records[1] and len(records[0].splitlines()) == 4 * 16
    want, got = (load_file(str(tmp_path / out / GATHERED)) for out in ("a", "c"))
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[name], got[name]) for name in want)


def test_gradient_norms_per_layer_add_up_to_the_steps_norm(grpo_assets, tmp_path):
    """The gradient_norms callback on a GRPO run: finite per-layer norms (model_state's
    gradients after Megatron's reduction, before clipping) whose root-sum-square is the
    step's grad_norm."""
    files = grpo_assets["files"]
    argv = grpo_argv(
        files, tmp_path / "run", "--callback", "gradient_norms:depth=3", steps=2, num_iterations=2
    )
    logged = run(tmp_path / "out", str(RECIPE), argv).metrics
    for step in (1, 2):
        norms = {k: v for k, v in logged[step].items() if k.startswith("grad_norm/")}
        layers = {k: v for k, v in norms.items() if k != "grad_norm/total"}
        assert {"grad_norm/model.layers.0", "grad_norm/model.layers.1"} <= set(layers)
        assert all(math.isfinite(v) and v > 0 for v in layers.values()), layers
        total = math.sqrt(sum(v * v for v in layers.values()))
        assert total == pytest.approx(logged[step]["grad_norm"], rel=1e-5)
        assert norms["grad_norm/total"] == pytest.approx(logged[step]["grad_norm"], rel=1e-5)


def exported_equals_gathered(checkpoint: Path, gathered: Path, out: Path, start: Path) -> None:
    """``baton export --format hf`` of ``checkpoint`` holds the gathered tensors (same
    names, shapes and values) and transformers loads it with those (trained) weights."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    assert baton(["export", str(checkpoint), str(out), "--format", "hf"]) == 0
    exported = load_file(str(out / "model.safetensors"))
    weights = load_file(str(gathered))
    assert sorted(weights) == sorted(exported)
    for name, tensor in exported.items():
        assert weights[name].shape == tensor.shape, name
        assert torch.equal(weights[name], tensor), name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    loaded = model.state_dict()
    initial = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).state_dict()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    assert any(not torch.equal(initial[name], weights[name]) for name in weights)


def test_gathered_weights_equal_the_export_of_the_trained_checkpoint(grpo_assets, tmp_path):
    """gather_weights after two GRPO steps (the fixed rollouts trained twice) equals ``baton export``'s safetensors of the
    run's last checkpoint, which transformers loads with the trained weights."""
    files = grpo_assets["files"]
    argv = grpo_argv(files, tmp_path / "run", steps=2, num_iterations=2)
    run(tmp_path / "out", str(RECIPE), argv)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    exported_equals_gathered(
        checkpoint, tmp_path / "out" / GATHERED, tmp_path / "hf", files["policy"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_gathered_weights_on_two_ranks_equal_the_export(grpo_assets, tmp_path, layout):
    """The same under tensor parallel 2 (q/k/v and gate/up gathered from both halves) or
    pipeline parallel 2 (each stage's layers sent to rank 0)."""
    from support.torchrun import torchrun

    files = grpo_assets["files"]
    flag = {"tp2": "--tp", "pp2": "--pp"}[layout]
    argv = grpo_argv(files, tmp_path / "run", flag, "2", steps=2, num_iterations=2)
    torchrun(WORKER, str(tmp_path / "out"), str(RECIPE), *argv)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    exported_equals_gathered(
        checkpoint, tmp_path / "out" / GATHERED, tmp_path / "hf", files["policy"]
    )


def bad_rewards(directory: Path) -> Path:
    """Reward functions that fail as the phase must refuse: one raising, one returning
    the wrong count, one returning NaN."""
    path = directory / "bad_rewards.py"
    path.write_text(
        "def raises(prompts, completions, completion_ids, **columns):\n"
        "    raise ValueError('no answer found')\n\n"
        "def too_few(prompts, completions, completion_ids, **columns):\n"
        "    return [0.0]\n\n"
        "def nan(prompts, completions, completion_ids, **columns):\n"
        "    return [float('nan')] * len(completions)\n"
    )
    return path


def test_bad_input_is_refused_in_one_line(grpo_assets, tmp_path, capsys):
    """From the command line: exit status 2, one line naming the problem, no checkpoint."""
    from baton.data import train_tokenizer
    from support.posttrain import posttrain_files

    files = grpo_assets["files"]
    other = posttrain_files(tmp_path / "other", SEQ_LEN, kinds=("sft",))
    tokenizer = train_tokenizer(tmp_path / "other-tok", vocab_size=300).path
    rewards = bad_rewards(tmp_path)

    def without(argv: list[str], flag: str) -> list[str]:
        at = argv.index(flag)
        return argv[:at] + argv[at + 2 :]

    def base(run_dir: Path, **settings: Any) -> list[str]:
        return grpo_argv(files, run_dir, **settings)

    def reward(run_dir: Path, name: str) -> list[str]:
        argv = base(run_dir)
        at = argv.index("--reward")
        return [*argv[:at], "--reward", f"{rewards}:{name}", *argv[at + 2 :]]

    sft_argv = [
        "--objective", "sft", "--init-from", str(files["policy"]),
        "--data-path", str(files["prepared"]), "--tokenizer", str(files["tokenizer"]),
        "--seq-len", str(SEQ_LEN), "--max-steps", "1", "--no-progress",
    ]  # fmt: skip
    cases: list[tuple[str, list[str], str]] = [
        ("sft-data", [*without(base(tmp_path / "a"), "--data-path"), "--data-path",
                      str(other["sft"])], "holds sft data"),
        ("prompts-to-sft", [*sft_argv, "--run-dir", str(tmp_path / "b")], "holds prompts"),
        ("one-generation", base(tmp_path / "c", num_generations=1),
         "--num-generations must be >= 2, got 1"),
        ("g-not-dividing", base(tmp_path / "d", num_generations=3),
         "--num-generations 3 does not divide the 16 rollouts"),
        ("long-prompt", base(tmp_path / "e", max_prompt_length=PROMPT_LENGTH - 1),
         f"longer than --max-prompt-length {PROMPT_LENGTH - 1}"),
        ("short-rows", [*without(base(tmp_path / "f"), "--seq-len"), "--seq-len", "30"],
         "pass --seq-len 34 or more"),
        ("tokenizer", [*without(base(tmp_path / "g"), "--tokenizer"), "--tokenizer",
                       str(tokenizer)], "tokenizer"),
        ("no-policy", without(base(tmp_path / "k"), "--init-from"),
         "samples completions with a transformers model of the policy"),
        ("raises", reward(tmp_path / "h", "raises"), "raises raised ValueError: no answer"),
        ("wrong-count", reward(tmp_path / "i", "too_few"), "returned 1 values for 16"),
        ("nan", reward(tmp_path / "j", "nan"), "nan returned NaN"),
    ]  # fmt: skip
    failures = []
    for case, argv, expected in cases:
        capsys.readouterr()
        status = baton(["run", str(RECIPE), *argv])
        err = capsys.readouterr().err.strip()
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        if status != 2 or expected not in err or len(err.splitlines()) != 1:
            failures.append((case, status, err))
        elif (run_dir / "checkpoints").exists():
            failures.append((case, "wrote a checkpoint", err))
    assert not failures, failures
