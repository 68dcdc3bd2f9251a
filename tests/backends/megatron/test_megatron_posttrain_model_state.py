"""``model_state`` callbacks on a Megatron-Core DPO run (recipes/megatron_gpt_tiny.py
--objective dpo): Freeze leaves layer 0 as loaded while every other parameter trains,
and EMA's averages equal the trained weights' average computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from baton.callbacks import EMA, Freeze
from baton.core.cli.recipe import build_driver
from support.posttrain import chat_tokenizer, preference_prefix, tiny_model
from support.resilience import LoggedMetrics, StepWeights, check_ema, check_frozen

RECIPE = Path(__file__).parents[3] / "recipes" / "megatron_gpt_tiny.py"
SEQ_LEN = 128
FROZEN = ["model.layers.0.*"]


def test_freeze_and_ema_on_a_dpo_run(tmp_path):
    tokenizer = chat_tokenizer(tmp_path / "tok")
    driver = build_driver(RECIPE, [
        "--objective", "dpo", "--init-from", str(tiny_model(tmp_path / "policy")),
        "--reference", str(tiny_model(tmp_path / "reference", seed=1)),
        "--data-path", str(preference_prefix(tmp_path / "pairs", tokenizer, seq_len=SEQ_LEN)),
        "--tokenizer", str(tokenizer), "--seq-len", str(SEQ_LEN), "--batch-size", "2",
        "--global-batch-size", "2", "--lr", "1e-2", "--max-steps", "3", "--log-every", "1",
        "--save-every", "0", "--no-async-save", "--no-progress", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    weights, metrics, ema = StepWeights(), LoggedMetrics(), EMA(decay=0.5)
    driver.callbacks += [Freeze(FROZEN), ema, weights, metrics]
    driver.fit()
    frozen = check_frozen(weights, FROZEN)
    assert metrics.metrics[1]["freeze/frozen"] == len(frozen)
    assert {"rewards/margins", "loss"} <= set(metrics.metrics[3])
    check_ema(weights, ema.averages, decay=0.5)
