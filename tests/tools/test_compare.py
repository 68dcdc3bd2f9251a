"""``baton compare``: the four backends from one Hugging Face Llama (built from the
flags), on one tokenizer and one prepared dataset, four steps each in their own
processes; the agreement table and the loss chart over all of them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baton.callbacks.sinks.jsonl import read_jsonl
from baton.core.model.spec import LlamaSpec, ModelSpec
from baton.data import PreparedDataset, load_tokenizer
from baton.tools.compare import main, max_relative_difference

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("fabric", "torchtitan", "megatron", "maxtext")
STEPS = 4


@pytest.mark.slow
def test_compare_backends_trains_all_four_on_the_same_tokens(tmp_path: Path) -> None:
    """As the README runs it, from a project root with its defaults (relative paths every
    backend must resolve before its framework sees them), only smaller."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")  # a project root of its own
    run_dir = tmp_path / "runs" / "compare_backends"  # the default --run-dir
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
    command = [
        sys.executable, "-m", "baton.core.cli.command", "compare", f"--steps={STEPS}", "--layers=2",
        "--hidden=64", "--heads=4", "--seq-len=32", "--batch=2", "--lr=1e-3",
        "--warmup-steps=2", "--min-lr=1e-4",
    ]  # fmt: skip
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    logs = {b: (run_dir / f"{b}.log") for b in BACKENDS}
    tails = "\n".join(
        f"--- {b}\n" + "\n".join(p.read_text().splitlines()[-15:])
        for b, p in logs.items()
        if p.is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails

    tokenizer = load_tokenizer(run_dir / "data" / "tokenizer")  # trained by the recipe
    data = PreparedDataset(str(run_dir / "data" / "reference"))  # prepared once with it
    data.check_tokenizer(tokenizer)
    spec = LlamaSpec.from_hf(run_dir / "model")  # the one model all four start from
    assert (spec.num_layers, spec.hidden_size, spec.num_heads) == (2, 64, 4)
    assert spec.vocab_size == 2048 and spec.ffn_hidden_size == 256
    finals, curves = {}, {}
    for backend in BACKENDS:
        records = read_jsonl(run_dir / backend / "logs" / "metrics.jsonl")
        losses = [r["loss"] for r in records if "loss" in r]
        assert [r["step"] for r in records if "loss" in r] == list(range(1, STEPS + 1)), backend
        assert all(math.isfinite(v) for v in losses), (backend, losses)
        # every backend starts near ln(vocabulary): the same tokens, untrained models
        assert abs(losses[0] - math.log(tokenizer.vocab_size)) < 1.0, (backend, losses[0])
        finals[backend], curves[backend] = losses[-1], losses
        # each ran on the prepared data and the tokenizer given to it
        command_line = logs[backend].read_text().splitlines()[0]
        relative = run_dir.relative_to(tmp_path)  # passed on as the user gave them
        assert f"--data-path={relative / 'data' / 'reference'}" in command_line
        assert f"--tokenizer={relative / 'data' / 'tokenizer'}" in command_line
        assert f"--init-from={relative / 'model'}" in command_line
        # one schedule: warmup 2 to 1e-3, cosine to 1e-4 at the last step, on all four
        lrs = [r["lr"] for r in records if "lr" in r]
        assert lrs == pytest.approx([lr_at(step) for step in range(1, STEPS + 1)]), backend

    chart = run_dir / "comparison" / "loss.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line}
    for backend, final in finals.items():  # the table: final loss, agreement with fabric
        diff = max_relative_difference(curves[backend], curves["fabric"])
        assert rows[backend][3] == f"{final:.4f}", rows[backend]
        assert rows[backend][4] == f"{diff:.2e}", rows[backend]
    assert rows["fabric"][4] == "0.00e+00"
    schedule = "schedule on every backend: warmup 2 steps to lr 0.001, cosine decay to 0.0001"
    assert f"{schedule} at step {STEPS}" in result.stdout


def lr_at(step: int) -> float:
    """``baton compare --warmup-steps 2 --lr 1e-3 --min-lr 1e-4`` over STEPS steps."""
    if step <= 2:
        return 1e-3 * step / 2
    return 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * (step - 2) / (STEPS - 2)))


def test_compare_gives_every_recipe_the_same_schedule_flags(tmp_path: Path) -> None:
    from baton.tools.compare import backend_command

    shared = {"init_from": "m", "data_path": "d", "tokenizer": "t", "steps": 20,
              "seq_len": 8, "batch": 2, "lr": 2e-3}  # fmt: skip
    for backend in BACKENDS:
        command = backend_command(backend, tmp_path, **shared, warmup_steps=3)
        flags = [f for f in command if f.split("=")[0] in ("--lr", "--warmup-steps", "--min-lr")]
        assert flags == ["--lr=0.002", "--warmup-steps=3", "--min-lr=0.0002"], backend


def test_compare_refuses_a_floor_above_the_peak(tmp_path, capsys):
    code = main(["--min-lr", "1e-2", "--lr", "1e-3", "--run-dir", str(tmp_path)])
    assert code == 2
    assert "--min-lr between 0 and --lr" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was prepared


def test_compare_refuses_an_init_from_that_is_no_hugging_face_model(tmp_path, capsys):
    code = main([f"--init-from={tmp_path}", f"--recipes={ROOT / 'recipes'}"])
    assert code == 2
    assert "is not a Hugging Face model directory" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_trains_one_qwen3_moe_config_on_all_four(tmp_path: Path) -> None:
    """``--model-config`` a Qwen3-MoE ``config.json``: compare writes its model with
    ``transformers``' own class, all four train it, and the table says which loss
    differences to expect (TorchTitan adds no load-balancing loss)."""
    from support.tiny_qwen3 import save_tiny_qwen3

    config = save_tiny_qwen3(tmp_path / "config", moe=True, vocab_size=512) / "config.json"
    run_dir = tmp_path / "compare"
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
    command = [
        sys.executable, "-m", "baton.core.cli.command", "compare", "--steps=2", "--seq-len=32",
        "--batch=2", "--vocab-size=512", f"--model-config={config}", f"--run-dir={run_dir}",
        f"--recipes={ROOT / 'recipes'}",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    tails = "\n".join(
        f"--- {b}\n" + "\n".join((run_dir / f"{b}.log").read_text().splitlines()[-15:])
        for b in BACKENDS
        if (run_dir / f"{b}.log").is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails
    written = ModelSpec.from_hf(run_dir / "model")  # Qwen3MoeForCausalLM.save_pretrained
    assert written == ModelSpec.from_hf(config)
    assert json.loads((run_dir / "model" / "config.json").read_text())["architectures"] == [
        "Qwen3MoeForCausalLM"
    ]
    first = {}
    for backend in BACKENDS:
        records = [
            r for r in read_jsonl(run_dir / backend / "logs" / "metrics.jsonl") if "loss" in r
        ]
        assert [r["step"] for r in records] == [1, 2], backend
        first[backend] = records[0]
        assert abs(records[0]["loss"] - math.log(512)) < 1.0, (backend, records[0])
    assert "moe/aux_loss" not in first["torchtitan"]
    assert all("moe/aux_loss" in first[b] for b in ("fabric", "megatron", "maxtext"))
    assert "differences to expect" in result.stdout
    assert "torchtitan: loss = cross entropy alone: TorchTitan adds no load-balancing loss" in (
        result.stdout
    )


def test_compare_refuses_a_model_config_and_init_from_together(tmp_path, capsys):
    code = main([f"--init-from={tmp_path}", f"--model-config={tmp_path}"])
    assert code == 2
    assert "not both" in capsys.readouterr().err


#: where each backend logs a step's cross entropy alone, when a mixture-of-experts model's
#: loss carries a load-balancing term: (metric, the term to take from it)
CROSS_ENTROPY = {
    "fabric": ("loss", "moe/aux_loss"),
    "torchtitan": ("loss", None),  # TorchTitan adds no load-balancing loss
    "megatron": ("loss", None),  # Megatron-Core adds its term to the gradient only
    "maxtext": ("lm_loss", None),
}


@pytest.mark.slow
def test_compare_sft_of_a_qwen3_moe_agrees_in_cross_entropy_on_all_four(tmp_path: Path) -> None:
    """``--objective sft`` on one prepared set of conversations whose rows all fit in one
    batch, from one Qwen3-MoE: every engine's first step reads the same rows, and their
    first-step cross entropies (the mean over the supervised tokens, without each
    engine's own load-balancing term) agree within 1e-5 relative."""
    from baton.data.packed import PackedDataset
    from baton.tools.data.posttrain import prepare_posttrain
    from support.posttrain import MODEL_VOCAB, chat_tokenizer, conversations
    from support.tiny_qwen3 import save_tiny_qwen3

    tokenizer = chat_tokenizer(tmp_path / "tok")
    model = save_tiny_qwen3(tmp_path / "model", moe=True, vocab_size=MODEL_VOCAB)
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(8)))
    prefix = tmp_path / "data" / "chat"
    prepare_posttrain([chat], tokenizer, prefix, seq_len=96)
    rows = PackedDataset(prefix).num_rows
    assert 1 < rows < 10  # one batch of every row; Fabric holds none out under 10 rows
    run_dir = tmp_path / "compare"
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
    command = [
        sys.executable, "-m", "baton.core.cli.command", "compare", "--objective=sft", "--steps=1",
        "--seq-len=96", f"--batch={rows}", f"--data-path={prefix}", f"--tokenizer={tokenizer}",
        f"--init-from={model}", f"--run-dir={run_dir}", f"--recipes={ROOT / 'recipes'}",
        "--backends", *BACKENDS,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    tails = "\n".join(
        f"--- {b}\n" + "\n".join((run_dir / f"{b}.log").read_text().splitlines()[-15:])
        for b in BACKENDS
        if (run_dir / f"{b}.log").is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails
    printed = result.stdout.split("first-step loss", 1)[1].splitlines()[1:5]
    first = {line.split()[0]: float(line.split()[1]) for line in printed}
    cross_entropy = {}
    for backend, (name, term) in CROSS_ENTROPY.items():
        command_line = (run_dir / f"{backend}.log").read_text().splitlines()[0]
        assert "--objective=sft" in command_line and f"--data-path={prefix}" in command_line
        logged = [
            r for r in read_jsonl(run_dir / backend / "logs" / "metrics.jsonl") if "loss" in r
        ]
        assert [r["step"] for r in logged] == [1], backend
        assert first[backend] == pytest.approx(logged[0]["loss"], rel=1e-7), backend
        assert logged[0].get("moe/load_balance", 0.0) >= 1.0, backend
        cross_entropy[backend] = logged[0][name] - (logged[0][term] if term else 0.0)
    assert logged[0]["moe/aux_loss"] > 0.0  # MaxText's own term is in its loss
    for value in cross_entropy.values():
        assert abs(value - cross_entropy["fabric"]) / value < 1e-5, cross_entropy
    assert abs(cross_entropy["fabric"] - math.log(MODEL_VOCAB)) < 1.0  # an untrained model


def test_compare_sft_refuses_a_backend_whose_recipe_has_no_objective(tmp_path, capsys):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "hf_finetune.py").write_text((ROOT / "recipes" / "hf_finetune.py").read_text())
    (recipes / "maxtext_tiny.py").write_text("def recipe(seq_len: int = 8):\n    pass\n")
    code = main(
        ["--objective=sft", f"--data-path={tmp_path}/chat.jsonl", f"--tokenizer={tmp_path}",
         f"--recipes={recipes}", "--backends", "fabric", "maxtext"]
    )  # fmt: skip
    assert code == 2
    assert "the recipe of maxtext has no --objective; choose from fabric" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_sft_on_ten_rows_or_more_reads_every_row_on_all_four(tmp_path: Path) -> None:
    """``--objective sft`` on a chat ``.jsonl`` that packs into more than ten rows, one
    batch of them all: no engine holds a row out (nothing is unless asked), so every
    first step reads the same rows and the first-step losses agree within 1e-5; every
    engine logs the same ``lr`` at every step, SFT's default schedule (constant)."""
    from baton.data.packed import PackedDataset
    from baton.tools.data.posttrain import prepare_posttrain
    from support.posttrain import MODEL_VOCAB, chat_tokenizer, conversations, tiny_model

    tokenizer = chat_tokenizer(tmp_path / "tok")
    model = tiny_model(tmp_path / "model")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(28)))
    probe = tmp_path / "probe" / "chat"
    prepare_posttrain([chat], tokenizer, probe, seq_len=96)
    rows = PackedDataset(probe).num_rows
    assert rows >= 10  # Fabric used to hold a tenth of such data out
    run_dir = tmp_path / "compare"
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline"}
    command = [
        sys.executable, "-m", "baton.core.cli.command", "compare", "--objective=sft", "--steps=2",
        "--seq-len=96", f"--batch={rows}", f"--data-path={chat}", f"--tokenizer={tokenizer}",
        f"--init-from={model}", f"--run-dir={run_dir}", f"--recipes={ROOT / 'recipes'}",
        "--lr=1e-3", "--backends", *BACKENDS,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    tails = "\n".join(
        f"--- {b}\n" + "\n".join((run_dir / f"{b}.log").read_text().splitlines()[-15:])
        for b in BACKENDS
        if (run_dir / f"{b}.log").is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails
    assert f"every backend trains on all {rows} rows, none held out" in result.stdout
    assert "schedule on every backend: constant lr 0.001" in result.stdout
    first, lrs = {}, {}
    for backend in BACKENDS:
        assert "--lr-schedule=constant" in (run_dir / f"{backend}.log").read_text()
        logged = [
            r for r in read_jsonl(run_dir / backend / "logs" / "metrics.jsonl") if "loss" in r
        ]
        assert [r["step"] for r in logged] == [1, 2], backend
        first[backend], lrs[backend] = logged[0]["loss"], [r["lr"] for r in logged]
    for backend, value in first.items():
        assert abs(value - first["fabric"]) / first["fabric"] < 1e-5, first
        assert lrs[backend] == pytest.approx([1e-3, 1e-3], rel=1e-6), (backend, lrs)
    assert abs(first["fabric"] - math.log(MODEL_VOCAB)) < 1.0


#: GRPO's first-step loss on every engine equals TRL's within 1e-5 relative (each engine's
#: own tests: tests/backends/*/test_*_grpo.py), so two engines' within 2e-5
GRPO_AGREEMENT = 2e-5


@pytest.mark.slow
def test_compare_grpo_on_recorded_rollouts_agrees_in_the_first_step_on_all_four(
    grpo_assets, tmp_path: Path
) -> None:
    """``--objective grpo`` from one Llama on the fixture's prompts (a ``.jsonl`` that
    compare prepares), every engine replaying the same recorded rollouts (``--generator
    recorded:``) scored by their recorded rewards, two iterations over them: each engine
    trains on the same completions, logs both steps (the per-step table shows them), and
    the first-step losses agree within ``GRPO_AGREEMENT`` and with TRL's GRPOTrainer's on
    those rollouts within 1e-5."""
    from support.grpo import GENERATIONS, MAX_COMPLETION, PROMPTS, TEMPERATURE, read_rollouts

    files = grpo_assets["files"]
    rollouts = files["rollouts"]
    reward = f"{ROOT / 'tests' / 'support' / 'grpo_rewards.py'}:recorded:path={rollouts}"
    run_dir = tmp_path / "compare"
    paths = [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]  # the reward's imports
    env = os.environ | {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "WANDB_MODE": "offline",
                        "PYTHONPATH": os.pathsep.join(p for p in paths if p)}  # fmt: skip
    command = [
        sys.executable, "-m", "baton.core.cli.command", "compare", "--objective=grpo",
        "--steps=2", "--seq-len=40", f"--batch={PROMPTS * GENERATIONS}",
        f"--data-path={files['prompts']}", f"--tokenizer={files['tokenizer']}",
        f"--init-from={files['policy']}", f"--run-dir={run_dir}", f"--recipes={ROOT / 'recipes'}",
        f"--generator=recorded:{rollouts}", f"--reward={reward}",
        f"--num-generations={GENERATIONS}", "--max-prompt-length=24",
        f"--max-completion-length={MAX_COMPLETION}", f"--temperature={TEMPERATURE}",
        "--top-k=0", "--num-iterations=2", "--backends", *BACKENDS,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    tails = "\n".join(
        f"--- {b}\n" + "\n".join((run_dir / f"{b}.log").read_text().splitlines()[-15:])
        for b in BACKENDS
        if (run_dir / f"{b}.log").is_file()
    )
    assert result.returncode == 0, result.stdout + result.stderr + tails
    print(result.stdout)
    assert f"data: {run_dir / 'data' / 'prompts'} ({PROMPTS} prompts)" in result.stdout
    recorded = sorted((r["prompt_ids"], r["completion_ids"]) for r in read_rollouts(rollouts))
    first, per_step = {}, {}
    for backend in BACKENDS:
        command_line = (run_dir / f"{backend}.log").read_text().splitlines()[0]
        assert "--objective=grpo" in command_line, backend
        assert f"--generator=recorded:{rollouts}" in command_line, backend
        trained = read_rollouts(run_dir / backend / "logs" / "rollouts.jsonl")
        given = sorted((r["prompt_ids"], r["completion_ids"]) for r in trained)
        assert given == recorded, backend  # each in the order its run drew the prompts
        logged = [
            r for r in read_jsonl(run_dir / backend / "logs" / "metrics.jsonl") if "loss" in r
        ]
        assert [r["step"] for r in logged] == [1, 2], backend
        assert all(math.isfinite(r["loss"]) for r in logged), backend
        first[backend], per_step[backend] = logged[0]["loss"], [r["loss"] for r in logged]
    printed = result.stdout.split("first-step loss", 1)[1].splitlines()[1:5]
    shown = {line.split()[0]: float(line.split()[1]) for line in printed}
    table = result.stdout.rsplit("\nstep", 1)[1].splitlines()
    assert table[0].split() == list(BACKENDS)
    for step in (1, 2):
        cells = table[step].split()
        assert cells[0] == str(step)
        for backend, cell in zip(BACKENDS, cells[1:], strict=True):
            assert float(cell) == pytest.approx(per_step[backend][step - 1], abs=1e-8)
    trl = grpo_assets["reference"](loss_type="dapo", beta=0.0)[0]["loss"]
    print({"trl": trl, **first})
    for backend, loss in first.items():
        assert shown[backend] == pytest.approx(loss, abs=5e-9), backend  # 8 decimals
        assert abs(loss - first["fabric"]) <= GRPO_AGREEMENT * abs(first["fabric"]), first
        assert loss == pytest.approx(trl, rel=1e-5), (backend, loss, trl)


def test_compare_offers_the_registered_objectives_its_backends_declare(monkeypatch) -> None:
    """``--objective``'s choices are read from the objective registry and the
    descriptors: an objective registered later and declared by a compared backend is one
    of them."""
    from dataclasses import replace

    from baton.core import backend_descriptor as descriptors
    from baton.core.objectives import OBJECTIVES
    from baton.tools.compare import compared_objectives
    from support.tempered_objective import TEMPERED

    assert compared_objectives() == ("pretrain", "sft", "dpo", "grpo")
    monkeypatch.setitem(OBJECTIVES._items, TEMPERED.name, TEMPERED)  # pyright: ignore[reportPrivateUsage]
    assert compared_objectives() == ("pretrain", "sft", "dpo", "grpo")  # no backend runs it
    fabric = descriptors.backend_descriptor("fabric")
    own = replace(fabric, objectives=(*fabric.objectives, TEMPERED.name))
    monkeypatch.setitem(descriptors._DECLARED, "fabric", own)
    assert compared_objectives() == ("pretrain", "sft", "dpo", "grpo", TEMPERED.name)


def test_compare_hands_every_backend_the_objectives_settings_it_was_given() -> None:
    from baton.tools.compare import backend_command, setting_flags

    flags = setting_flags(
        "grpo",
        {"num_generations": 4, "reward": ("a.py:f", "b.py:g"), "reward_weights": (1.0, 0.5),
         "mask_truncated_completions": True, "generator": "recorded:r.jsonl"},
    )  # fmt: skip
    assert flags == [
        "--num-generations=4", "--reward=a.py:f", "--reward=b.py:g", "--reward-weights",
        "1.0", "0.5", "--mask-truncated-completions", "--generator=recorded:r.jsonl",
    ]  # fmt: skip
    shared = {"init_from": "m", "data_path": "d", "tokenizer": "t", "steps": 2,
              "seq_len": 40, "batch": 16, "lr": 1e-3}  # fmt: skip
    for backend in BACKENDS:
        command = backend_command(
            backend, Path("runs"), **shared, objective="grpo", objective_flags=flags
        )
        at = command.index("--objective=grpo")
        assert command[at + 1 : at + 1 + len(flags)] == flags, backend


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--objective=sft", "--num-generations=4"],
         "--num-generations is not a setting of --objective sft"),
        (["--objective=grpo", "--num-generations=1"], "--num-generations must be >= 2, got 1"),
        (["--objective=grpo"], "--objective grpo scores completions with reward functions"),
        (["--objective=grpo", "--reward=r.py:f"], "--objective grpo needs --data-path (prompts"),
    ],
)  # fmt: skip
def test_compare_refuses_bad_objective_settings_before_anything_is_written(
    tmp_path, capsys, argv, problem
):
    code = main([*argv, f"--run-dir={tmp_path / 'run'}", f"--recipes={ROOT / 'recipes'}"])
    err = capsys.readouterr().err
    assert code == 2 and problem in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
