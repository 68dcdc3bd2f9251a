"""One model, Fabric: ``recipes/hf_finetune.py`` trains ``transformers.LlamaForCausalLM``
from a ``--model-config`` alone, records baton's model spec and refuses another
architecture by field (the --init-from and export paths: tests/backends/fabric/test_hf.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.tiny_llama import save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "hf_finetune.py"


def test_model_config_alone_trains_and_records_the_spec(tmp_path):
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=256)
    run = ["--run-dir", str(tmp_path / "run"), "--log-every", "1", "--eval-every", "50"]
    driver = build_driver(
        RECIPE, ["--model-config", str(hf_dir / "config.json"), "--max-steps", "2", *run]
    )
    result = driver.fit()
    assert result.step == 2
    assert driver.options.settings["model_spec"]["num_kv_heads"] == 2
    other = save_tiny_llama(tmp_path / "other", vocab_size=256, intermediate_size=128)
    with pytest.raises(UsageError, match="ffn_hidden_size is 176 there, 128 here"):
        build_driver(
            RECIPE, ["--model-config", str(other), "--max-steps", "3", "--resume", "auto", *run]
        ).fit()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    with pytest.raises(UsageError, match="ffn_hidden_size is 176 there, 128 here"):
        build_driver(RECIPE, ["--model-config", str(other), "--init-from", str(checkpoint)])
    with pytest.raises(UsageError, match="--init-from HF_DIR"):
        build_driver(RECIPE, [])
