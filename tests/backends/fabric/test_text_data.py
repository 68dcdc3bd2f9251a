"""Real tokens on the Fabric backend: a prepared dataset (baton data prepare) and local
JSONL through ``datasets``, both packed into the same windows, both resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.backends.fabric.text import Blended, TokenWindows
from baton.core import Callback
from baton.core.cli.recipe import build_driver
from baton.data import DataError, train_tokenizer
from baton.data.corpus import reference_documents
from support.recording import Losses

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "recipes" / "quickstart.py"
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "32"]
TINY += ["--batch-size", "4", "--log-every", "1", "--eval-every", "8", "--no-progress"]
TINY += ["--eval-split", "0.1"]  # nothing is held out unless asked: evaluate the last tenth


class StopAt(Callback):
    """Save and stop at a step (the schedule stays the one of the full run)."""

    def __init__(self, step: int) -> None:
        self.at = step

    def on_step_end(self, driver, output):
        if driver.step == self.at:
            driver.control.request_save("test", all_ranks=True)
            driver.control.request_stop("test", all_ranks=True)


def run(args: list[str], *callbacks: Callback, resume: str = "none") -> Losses:
    losses = Losses()
    driver = build_driver(QUICKSTART, [*TINY, *args, "--resume", resume])
    driver.callbacks += [losses, *callbacks]
    driver.fit()
    return losses


def test_prepared_and_jsonl_paths_train_alike_and_resume_exactly(tmp_path):
    from baton.tools.data.prepare import prepare

    tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=400)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in reference_documents()[:30]))
    prepare([docs], tokenizer, tmp_path / "data" / "corpus", workers=1)
    prepared = [
        "--data-path",
        str(tmp_path / "data" / "corpus"),
        "--tokenizer",
        str(tmp_path / "tok"),
    ]
    jsonl = ["--data-path", str(docs), "--tokenizer", str(tmp_path / "tok")]

    full = run([*prepared, "--max-steps", "8", "--run-dir", str(tmp_path / "a")])
    assert full.values[8] < full.values[1]
    # the same documents through datasets + the tokenizer: the same windows, the same losses
    via_datasets = run([*jsonl, "--max-steps", "8", "--run-dir", str(tmp_path / "b")])
    assert via_datasets.values == full.values

    run([*prepared, "--max-steps", "8", "--run-dir", str(tmp_path / "c")], StopAt(4))
    resumed = run([*prepared, "--max-steps", "8", "--run-dir", str(tmp_path / "c")], resume="auto")
    assert {s: resumed.values[s] for s in range(5, 9)} == {s: full.values[s] for s in range(5, 9)}

    other = train_tokenizer(tmp_path / "other", vocab_size=300)
    assert other.fingerprint != tokenizer.fingerprint
    with pytest.raises(DataError, match="fingerprint|tokenizer"):
        build_driver(QUICKSTART, [*prepared[:2], "--tokenizer", str(tmp_path / "other")])


def test_blend_interleaves_in_proportion():
    a, b = TokenWindows(list(range(1001)), 10), TokenWindows(list(range(5001)), 10)
    blend = Blended([a, b], [0.25, 0.75])
    assert len(blend) == 400  # a's 100 windows are a quarter of it
    first = [int(blend.which[i]) for i in range(40)]
    assert first.count(0) == 10 and first.count(1) == 30
    x, y = blend[0]
    assert x.shape == (10,) and (y[:-1] == x[1:]).all()


def test_hf_recipe_on_tokenized_jsonl(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    train_tokenizer(tmp_path / "tok", vocab_size=400)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in reference_documents()[:20]))
    recipe = ROOT / "recipes" / "hf_finetune.py"
    args = ["--data-path", str(docs), "--tokenizer", str(tmp_path / "tok"), "--seq-len", "33"]
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, **shape)).save_pretrained(tmp_path / "bytes")
    with pytest.raises(ValueError, match="vocabulary has 400 tokens, the model's only 256"):
        build_driver(recipe, ["--init-from", str(tmp_path / "bytes"), *args])
    LlamaForCausalLM(LlamaConfig(vocab_size=512, **shape)).save_pretrained(tmp_path / "llama")
    args += ["--max-steps", "3", "--eval-every", "3", "--eval-split", "0.1", "--batch-size", "4"]
    driver = build_driver(
        recipe, ["--init-from", str(tmp_path / "llama"), *args, "--run-dir", str(tmp_path / "r")]
    )
    losses = Losses()
    driver.callbacks.append(losses)
    driver.options = driver.options.replace(log_every=1)
    driver.fit()
    assert sorted(losses.values) == [1, 2, 3] and all(5 < v < 7 for v in losses.values.values())
