"""The real-size recipes take ``--model-config`` and ``--init-from`` like the tiny ones:
given a tiny Llama (Llama 3.1's ``rope_scaling`` included) they build that architecture
with their own settings. TorchTitan's 8B recipe trains it 2 steps on CPU from the
directory's weights, and so does Megatron-Core's (bf16, the distributed optimizer);
MaxText's is checked as configured (its 7B settings need flash attention on a GPU or
a TPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from baton.core import Callback, Driver
from baton.core.cli.recipe import build_driver
from baton.core.model.spec import LlamaSpec
from support.recording import Losses
from support.tiny_llama import LLAMA31_ROPE, save_tiny_llama

RECIPES = Path(__file__).parents[2] / "recipes"
#: Llama 3.1's scaling shows only past 8,192 original positions
SHAPE = {"rope_scaling": LLAMA31_ROPE, "max_position_embeddings": 16384}


def test_torchtitan_8b_recipe_plans_and_trains_a_model_config(tmp_path, capfd):
    # capfd, not capsys: TorchTitan's trainer enables faulthandler on sys.stderr's fd
    pytest.importorskip("torchtitan")
    from baton.backends.torchtitan.hf import flavor_name
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents

    recipe = RECIPES / "torchtitan_llama3_8b.py"
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=4096, initializer_range=0.3, **SHAPE)
    spec = LlamaSpec.from_hf(hf_dir)
    assert (
        build_driver(recipe, ["--dry-run", "--model-config", str(hf_dir), "--world-size", "1"])
        is None
    )
    assert f"model        llama3 {flavor_name(spec)}:" in capfd.readouterr().out

    tokenizer = str(train_tokenizer(tmp_path / "tok", vocab_size=4096).path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in reference_documents()[:50]))
    driver = build_driver(recipe, [
        "--init-from", str(hf_dir), "--tokenizer", tokenizer, "--data-path", str(corpus),
        "--max-steps", "2", "--seq-len", "64", "--log-every", "1",
        "--no-async-save", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    assert driver is not None
    record = Losses()
    driver.callbacks.append(record)
    assert driver.fit().step == 2
    model = driver.backend.config.model_spec.model
    rope = model.layers[0].attention.rope
    assert (model.dim, len(model.layers), model.vocab_size) == (64, 2, 4096)
    assert (rope.scaling, rope.scaling_factor, rope.original_max_position_embeddings) == (
        "llama", 8.0, 8192,
    )  # fmt: skip
    # the directory's large weights, not a fresh model's (whose loss is about ln 4096)
    assert record.values[1] > math.log(4096) + 1
    assert LlamaSpec.from_dict(driver.options.settings["model_spec"]) == spec


def test_megatron_8b_recipe_plans_and_trains_a_model_config(tmp_path, capsys):
    """Its own settings (bf16, the distributed optimizer, async saves) on CPU."""
    pytest.importorskip("megatron.core")
    import torch

    from baton.backends.megatron.hf import gpt_model, transformer_fields
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    recipe = RECIPES / "megatron_llama3_8b.py"
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=4096, initializer_range=0.3, **SHAPE)
    spec = LlamaSpec.from_hf(hf_dir)
    argv = ["--model-config", str(hf_dir), "--tp", "1", "--world-size", "2"]
    assert build_driver(recipe, ["--dry-run", *argv]) is None
    out = capsys.readouterr().out
    assert "model 2 layers, hidden 64, FFN 176, 4 heads x 16 (2 KV groups), vocab 4096" in out
    assert "rope base 10000, rope scaling x8" in out
    assert "world size 2 = tensor 1 x pipeline 1 x data 2" in out

    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=4096)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in reference_documents()[:200]))
    prepare([corpus], tokenizer, tmp_path / "data" / "corpus", workers=1)
    driver = build_driver(recipe, [
        "--init-from", str(hf_dir), "--tokenizer", str(tokenizer.path), "--data-path",
        str(tmp_path / "data" / "corpus"), "--max-steps", "2", "--seq-len", "64",
        "--global-batch-size", "2", "--tp", "1", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    assert driver is not None
    config = driver.backend.config
    fields = transformer_fields(spec)
    assert {name: getattr(config.model, name) for name in fields} == fields
    assert (config.vocab_size, config.rotary_base, config.rope_scaling) == (4096, 10000.0, True)
    assert config.init_from == str(hf_dir) and config.model.bf16
    record, dtypes = Losses(), set()

    class WeightTypes(Callback):
        def on_step_end(self, driver: Driver, output: Any) -> None:
            dtypes.update(p.dtype for p in gpt_model(driver.backend.chunks[0]).parameters())

    driver.callbacks += [record, WeightTypes()]
    assert driver.fit().step == 2
    assert record.values[2] > math.log(4096) + 1  # the directory's large weights
    # bf16 as Megatron-LM builds it: the weights in bf16 (Float16Module), the optimizer's
    # main copies in fp32
    assert dtypes == {torch.bfloat16}
    assert driver.options.settings["model_spec"] == spec.to_dict()


def test_maxtext_7b_recipe_builds_a_model_config(tmp_path):
    from baton.backends.maxtext.hf import maxtext_settings

    recipe = RECIPES / "maxtext_llama2_7b.py"
    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512, **SHAPE)
    spec = LlamaSpec.from_hf(hf_dir)
    from baton.data import train_tokenizer

    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=300).path  # checked before the build
    argv = ["--model-config", str(hf_dir), "--data-path", "data/corpus"]
    driver = build_driver(recipe, [*argv, "--tokenizer", str(tokenizer)])
    assert driver is not None
    config = driver.backend.config
    settings = maxtext_settings(spec)
    assert {key: config[key] for key in settings} == settings
    assert config["model_name"] == "default" and config["rope_type"] == "llama3.1"
    assert config["attention"] == "cudnn_flash_te"  # the 7B recipe's own settings stay
    assert driver.options.settings["model_spec"] == spec.to_dict()
