"""SFT and DPO runs on TorchTitan (recipes/torchtitan_llama3_debug.py) keep what
pretraining runs have: a DPO run rolled back to an earlier checkpoint replays the same
losses and rewards bit for bit (the stored reference log-probabilities read again),
Freeze and EMA act on an SFT run's weights, and the SFT run's Hugging Face export gives
the logits of the weights TorchTitan trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchtitan")

import torch

from baton.callbacks import EMA, Freeze
from baton.core.cli.recipe import build_driver
from support.posttrain import (
    chat_tokenizer,
    preference_prefix,
    sft_prefix,
    sft_reference,
    tiny_model,
)
from support.resilience import (
    LoggedMetrics,
    RollbackOnce,
    StepWeights,
    check_ema,
    check_frozen,
    check_replayed,
)

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH = 96, 2
FROZEN = ["model.layers.0.*"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("titan_resilience")
    tokenizer = chat_tokenizer(root / "tok")
    return {
        "root": root,
        "tokenizer": tokenizer,
        "policy": tiny_model(root / "policy"),
        "reference": tiny_model(root / "reference", seed=1),
        "sft": sft_prefix(root / "sft", tokenizer, seq_len=SEQ, num_rows=16),
        "pairs": preference_prefix(root / "pairs", tokenizer, seq_len=SEQ, num_rows=16),
    }


def fit(assets, run_dir: Path, objective: str, callbacks: list, *extra: str):
    data = assets["sft"] if objective == "sft" else assets["pairs"]
    args = [
        "--objective", objective, "--data-path", str(data),
        "--tokenizer", str(assets["tokenizer"]), "--init-from", str(assets["policy"]),
        "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--log-every", "1",
        "--run-dir", str(run_dir), "--no-progress", *extra,
    ]  # fmt: skip
    if objective == "dpo":
        args += ["--reference", str(assets["reference"])]
    driver = build_driver(RECIPE, args)
    driver.callbacks += callbacks
    driver.fit()
    return driver


def test_a_dpo_rollback_replays_the_uninterrupted_run_bitwise(assets, tmp_path):
    """Checkpoints at steps 2 and 4; at step 5's start the run goes back to step 2 and
    trains steps 3-6 again with the losses and rewards of the run that never went back."""
    straight, straight_weights = LoggedMetrics(), StepWeights()
    fit(assets, tmp_path / "straight", "dpo", [straight, straight_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    replayed, replayed_weights = LoggedMetrics(), StepWeights()
    rollback = RollbackOnce(at_step=5, to_step=2)
    fit(assets, tmp_path / "rollback", "dpo", [rollback, replayed, replayed_weights],
        "--max-steps", "6", "--save-every", "2")  # fmt: skip
    assert rollback.done
    keys = ["loss", "grad_norm", "rewards/chosen", "rewards/rejected", "logps/chosen"]
    check_replayed(straight, replayed, straight_weights, replayed_weights, keys)


@pytest.fixture(scope="module")
def sft_run(assets) -> dict[str, object]:
    """3 SFT steps with layer 0 frozen and EMA(0.5), saved at step 3."""
    weights, metrics, ema = StepWeights(), LoggedMetrics(), EMA(decay=0.5)
    run_dir = assets["root"] / "sft_run"
    fit(assets, run_dir, "sft", [Freeze(FROZEN), ema, weights, metrics],
        "--max-steps", "3", "--save-every", "3")  # fmt: skip
    return {"weights": weights, "metrics": metrics, "ema": ema, "run_dir": run_dir}


def test_freeze_and_ema_on_sft(assets, sft_run):
    """Layer 0 never moves while the rest trains, EMA(0.5) is the weights' average, and
    the first step (frozen or not, the forward is the same) has the loss of
    ``transformers`` on each conversation of its rows alone."""
    frozen = check_frozen(sft_run["weights"], FROZEN)
    first = sft_run["metrics"].metrics[1]
    assert first["freeze/frozen"] == len(frozen)
    check_ema(sft_run["weights"], sft_run["ema"].averages, decay=0.5)
    loss, _ = sft_reference(assets["policy"], assets["sft"], rows=range(BATCH))
    assert first["loss"] == pytest.approx(loss, rel=1e-5)


def test_the_sft_export_gives_the_trained_weights_logits(assets, sft_run, tmp_path):
    """``baton export --format hf`` of the SFT checkpoint: ``transformers`` loads it and
    its logits equal TorchTitan's model holding the weights the run trained, on a packed
    row's conversation and on random tokens."""
    from baton.backends.torchtitan.export import dcp_folder, read_model_weights
    from baton.backends.torchtitan.hf import model_config
    from baton.core.model.spec import LlamaSpec
    from baton.tools.export import main as export_main
    from support.tiny_llama import load_llama
    from support.titan_model import sdpa_model

    checkpoint = sft_run["run_dir"] / "checkpoints" / "step_000003"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = load_llama(tmp_path / "hf")
    trained = read_model_weights(dcp_folder(checkpoint))
    # the checkpoint holds what training ended with (not the starting weights)
    last = sft_run["weights"].values[3]
    assert any(not np.array_equal(v, sft_run["weights"].values[0][k]) for k, v in last.items())
    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = sdpa_model(model_config(LlamaSpec.from_hf(assets["policy"])), trained)(tokens)
        got = exported(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # and the export's weights are the ones training ended with, bit for bit (the
    # model_state view of a projection may be shaped by heads: same values, same order)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for name, value in last.items():
        assert np.array_equal(saved[name].numpy().reshape(value.shape), value), name


def test_the_sft_export_of_the_averages_holds_the_ema_weights(sft_run, tmp_path):
    """``baton export --ema`` of the SFT checkpoint writes EMA's averages of step 3."""
    from safetensors.torch import load_file

    from baton.tools.export import main as export_main

    checkpoint = sft_run["run_dir"] / "checkpoints" / "step_000003"
    assert export_main([str(checkpoint), str(tmp_path / "ema"), "--format", "hf", "--ema"]) == 0
    saved = load_file(str(tmp_path / "ema" / "model.safetensors"))
    averages = sft_run["ema"].averages
    assert set(saved) == set(averages)
    for name, value in averages.items():
        want = value.detach().cpu().numpy()
        assert np.array_equal(saved[name].numpy().reshape(want.shape), want), name
