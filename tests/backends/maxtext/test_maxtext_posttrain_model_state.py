"""``model_state`` callbacks on a MaxText SFT run of a Qwen3 (recipes/maxtext_tiny.py
--objective sft): the parameters carry the Hugging Face names and values of the model the
run started from, Freeze leaves layer 0 (a slice of the scanned layers) as loaded while
every other parameter trains, and EMA's averages equal the trained weights' average
computed by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("maxtext")

from safetensors.numpy import load_file

from baton.callbacks import EMA, Freeze
from baton.core.cli.recipe import build_driver
from support.posttrain import chat_tokenizer, sft_prefix, tiny_model
from support.resilience import LoggedMetrics, StepWeights, check_ema, check_frozen

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
SEQ = 128
FROZEN = ["model.layers.0.*"]


@pytest.mark.slow  # MaxText compiles its step and the freezing step: ~1 minute on CPU
def test_freeze_and_ema_on_an_sft_run(tmp_path):
    tokenizer = chat_tokenizer(tmp_path / "tok")
    model = tiny_model(tmp_path / "model", family="qwen3")
    driver = build_driver(RECIPE, [
        "--objective", "sft", "--init-from", str(model),
        "--data-path", str(sft_prefix(tmp_path / "data", tokenizer, SEQ, num_rows=8)),
        "--tokenizer", str(tokenizer), "--seq-len", str(SEQ), "--batch-size", "2",
        "--max-steps", "3", "--log-every", "1", "--save-every", "0",
        "--no-callback", "checkpoint", "--run-dir", str(tmp_path / "run"), "--no-progress",
        "--overrides", "dtype=float32", f"base_output_directory={tmp_path / 'out'}",
    ])  # fmt: skip
    weights, metrics, ema = StepWeights(), LoggedMetrics(), EMA(decay=0.5)
    driver.callbacks += [Freeze(FROZEN), ema, weights, metrics]
    driver.fit()
    start = load_file(str(model / "model.safetensors"))
    assert set(weights.values[0]) == set(start)
    for name, value in start.items():
        np.testing.assert_allclose(weights.values[0][name], value, rtol=1e-6, err_msg=name)
    frozen = check_frozen(weights, FROZEN)
    assert metrics.metrics[1]["freeze/frozen"] == len(frozen)
    check_ema(weights, ema.averages, decay=0.5)
