"""Every LLM engine reads prepared data with the tokenizer that prepared it: without
``--tokenizer`` the recipe takes the manifest's, with another one it refuses before
anything is built (exit status 2, no run directory), and ``run.json`` records the one used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from baton.core.cli.command import main
from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from baton.data import train_tokenizer

RECIPES = Path(__file__).parents[2] / "recipes"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small tokenizer, a prefix prepared with it, another tokenizer, a 512-row Llama config."""
    from transformers import LlamaConfig

    from baton.tools.data.prepare import prepare

    root = tmp_path_factory.mktemp("prepared")
    texts = ["def f(x):\n    return x + 1\n" * 40, "class A:\n    pass\n" * 40]
    tok = train_tokenizer(root / "tok", vocab_size=320, texts=texts).path
    other = train_tokenizer(root / "other", vocab_size=300, texts=["x = 1\n" * 50]).path
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t * 4}) + "\n" for t in texts * 20))
    prepare([docs], tok, root / "corpus", workers=1)
    llama = root / "llama"
    LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
    ).save_pretrained(llama)  # fmt: skip
    return {"tok": tok, "other": other, "prefix": root / "corpus", "llama": llama}


def engine_tokenizer(recipe: str, backend: Any) -> str | None:
    """The tokenizer directory the engine's own config will read the data with."""
    config = backend.config
    if recipe == "torchtitan_llama3_debug.py":
        return config.hf_assets_path
    if recipe == "megatron_gpt_tiny.py":
        return config.data.tokenizer
    if recipe == "maxtext_tiny.py":
        return config.tokenizer
    return None  # hf_finetune: the tokenizer is read into its data loaders


ENGINES = {
    "torchtitan_llama3_debug.py": [],
    "megatron_gpt_tiny.py": [],
    "maxtext_tiny.py": [],
    "hf_finetune.py": ["--model-config", "{llama}"],
}


@pytest.mark.parametrize("recipe", list(ENGINES))
def test_prepared_data_brings_its_tokenizer(recipe, data, tmp_path):
    flags = [flag.format(**data) for flag in ENGINES[recipe]]
    run_dir = tmp_path / "run"
    argv = ["--data-path", str(data["prefix"]), "--run-dir", str(run_dir), *flags]
    driver = build_driver(RECIPES / recipe, [*argv, "--max-steps", "2"])
    assert driver is not None
    assert driver.options.settings["tokenizer"] == str(data["tok"])
    if (used := engine_tokenizer(recipe, driver.backend)) is not None:
        assert used == str(data["tok"])

    with pytest.raises(UsageError, match="prepared with tokenizer .* but this run uses") as error:
        build_driver(RECIPES / recipe, [*argv, "--tokenizer", str(data["other"])])
    assert error.value.exit_status == 2
    assert not run_dir.exists()


@pytest.mark.parametrize("recipe", list(ENGINES))
def test_a_missing_tokenizer_is_refused_before_the_build(recipe, data, tmp_path, capsys):
    flags = [flag.format(**data) for flag in ENGINES[recipe]]
    run_dir = tmp_path / "run"
    argv = ["run", str(RECIPES / recipe), "--run-dir", str(run_dir), *flags]
    assert main([*argv, "--data-path", str(data["prefix"]), "--tokenizer", "absent/tok"]) == 2
    assert "tokenizer directory absent/tok does not exist" in capsys.readouterr().err
    assert not run_dir.exists()


def test_torchtitan_trains_prepared_ids_with_the_manifests_tokenizer(data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["run", str(RECIPES / "torchtitan_llama3_debug.py"), "--data-path", str(data["prefix"])]
    argv += ["--run-dir", str(run_dir), "--max-steps", "2", "--seq-len", "32", "--batch-size", "2"]
    assert main([*argv, "--save-every", "0", "--no-progress", "--log-every", "1"]) == 0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["settings"]["tokenizer"] == str(data["tok"])
