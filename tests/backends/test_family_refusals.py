"""A backend that cannot build a model family yet refuses it by name when the recipe is
built, before any model exists (the spec's ``require_family``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.core.errors import UsageError
from baton.core.recipe import build_driver

RECIPES = Path(__file__).parents[2] / "recipes"
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}


@pytest.mark.parametrize(
    ("recipe", "backend"),
    [
        ("megatron_gpt_tiny.py", "megatron"),
    ],
)
def test_a_qwen3_moe_config_is_refused_by_name_before_anything_is_built(tmp_path, recipe, backend):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    args = ["--model-config", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    with pytest.raises(UsageError, match=f"{backend} cannot build model_type 'qwen3_moe' yet"):
        build_driver(RECIPES / recipe, args)
    assert not (tmp_path / "run" / "checkpoints").exists()
