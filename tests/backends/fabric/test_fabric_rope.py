"""Llama 3.1-style ``rope_scaling`` on Fabric: ``recipes/hf_finetune.py --init-from`` a
tiny Llama whose scaling changes most rotary frequencies trains ``transformers``' own
scaled model: the first loss is the source model's, and the spec records the scaling."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from baton.core.cli.recipe import build_driver
from support.recording import Losses
from support.tiny_llama import SHORT_CONTEXT_ROPE, load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "hf_finetune.py"


def test_init_from_scaled_rope_first_loss_equals_transformers(tmp_path):
    import torch

    spec = importlib.util.spec_from_file_location("hf_finetune_rope", RECIPE)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    hf_dir = save_tiny_llama(
        tmp_path / "hf", vocab_size=256, rope_scaling=SHORT_CONTEXT_ROPE, initializer_range=0.3
    )
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "1", "--log-every", "1",
        "--eval-every", "50", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    batch = next(iter(recipe.byte_lm_data(seq_len=64, batch_size=8, seed=0, path=None)[0]))
    with torch.no_grad():
        expected = load_llama(hf_dir)(**batch).loss.item()
    assert record.values[1] == pytest.approx(expected, rel=1e-4)
    assert driver.options.settings["model_spec"]["rope_scaling"] == {
        key: value for key, value in SHORT_CONTEXT_ROPE.items() if key != "rope_type"
    }
