"""Hugging Face weights in (--init-from) and out (baton export --format hf), and baton eval."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
from baton.backends.fabric.weights import WeightsError
from baton.core import Callback, Driver
from baton.core.cli.command import main as baton
from baton.core.cli.recipe import build_driver

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "hf_finetune.py"


def hf_recipe():
    spec = importlib.util.spec_from_file_location("hf_finetune_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Record(Callback):
    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.evals: list[dict[str, float]] = []

    def on_log(self, driver, metrics):
        if "loss" in metrics:
            self.loss[driver.step] = metrics["loss"]

    def on_eval_end(self, driver, metrics):
        self.evals.append(metrics)


def test_finetune_from_hf_weights_export_and_eval(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    hf = hf_recipe()
    source = hf.save_tiny_llama(tmp_path / "tiny-llama")
    run_dir = tmp_path / "run"
    args = ["--init-from", str(source), "--max-steps", "4", "--log-every", "1"]
    args += ["--eval-every", "4", "--save-every", "4", "--run-dir", str(run_dir)]

    # the first step's loss is the source model's loss on the first batch: its weights,
    # a fresh optimizer, step 0
    first_batch = next(iter(hf.byte_lm_data(seq_len=64, batch_size=8, seed=0, path=None)[0]))
    reference = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        expected_first = reference(**first_batch).loss.item()
    driver = build_driver(RECIPE, args)
    record = Record()
    driver.callbacks.append(record)
    driver.fit()
    assert record.loss[1] == expected_first
    assert record.loss[4] < record.loss[1]

    # export: transformers loads it, logits equal the trained model's
    checkpoint = run_dir / "checkpoints" / "step_000004"
    out = tmp_path / "exported"
    assert baton(["export", str(checkpoint), "--format", "hf", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out)
    trained = driver.backend.raw_model.eval()
    with torch.no_grad():
        ids = first_batch["input_ids"]
        assert torch.equal(exported(input_ids=ids).logits, trained(input_ids=ids).logits)

    # eval only: the checkpoint's evaluation is the one the run logged at step 4
    capsys.readouterr()
    code = baton(
        [
            "eval",
            str(RECIPE),
            "--checkpoint",
            str(checkpoint),
            *args[:2],
            "--run-dir",
            str(tmp_path / "eval"),
        ]
    )
    assert code == 0
    printed = dict(re.findall(r"^(eval/\S+) (\S+)$", capsys.readouterr().out, re.M))
    assert printed["eval/loss"] == f"{record.evals[-1]['eval/loss']:.6g}"

    # weights of another shape: the first mismatching parameter and both shapes
    smaller = tmp_path / "smaller"
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(smaller)
    mismatched = build_driver(
        RECIPE,
        [
            "--init-from",
            str(smaller),
            "--model-config",
            str(source),
            "--run-dir",
            str(tmp_path / "bad"),
        ],
    )
    with pytest.raises(WeightsError, match=r"'model.embed_tokens.weight' has shape \(256, 32\)"):
        mismatched.fit()
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_export_of_a_checkpoint_without_hf_mapping_is_refused(tmp_path, capsys):
    settings = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=16),
        batch_size=2,
        accelerator="cpu",
    )
    driver = Driver(settings.backend(), max_steps=1, run_dir=tmp_path)
    driver.options = driver.options.replace(save_on_stop=True)
    driver.fit()
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    assert baton(["export", str(checkpoint), "--format", "hf", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "has no Hugging Face mapping" in error and "not a transformers model" in error
    assert not (tmp_path / "out").exists()
