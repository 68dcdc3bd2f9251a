"""One model, MaxText: a Hugging Face Llama built from MaxText config keys and started
from its weights (``recipes/maxtext_tiny.py --init-from HF_DIR``): the first loss is the
``transformers`` model's on the same batch. One MaxText run (imports take 20-40 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("maxtext")

import torch

from baton.core.cli.recipe import build_driver
from support.recording import Losses
from support.tiny_llama import hf_loss, load_llama, save_tiny_llama

RECIPE = Path(__file__).parents[3] / "recipes" / "maxtext_tiny.py"
SEQ, BATCH = 64, 2


def nth_batch(batches: Any, index: int) -> Any:
    """The batch the run reads at its step ``index + 1`` (0-based batch ``index``)."""
    batches.skip_to(index)
    return next(batches)


def test_init_from_hf_first_loss_equals_transformers(tmp_path):
    """fp32 activations (MaxText's default is bfloat16); weights far from a fresh model's
    (initializer_range 0.3: a loss of about 9 against ln 512 = 6.2 for a fresh one)."""
    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512, initializer_range=0.3)
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "1", "--save-every", "0",
        "--no-callback", "checkpoint",
        "--log-every", "1", "--eval-every", "0", "--batch-size", str(BATCH),
        "--seq-len", str(SEQ), "--run-dir", str(tmp_path / "run"), "--no-progress",
        "--overrides", "dtype=float32",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    batch = nth_batch(TextBatches(TextCorpus.load(None).train, batch_size=BATCH, seq_len=SEQ), 0)
    tokens, targets = (torch.from_numpy(batch[k]).long() for k in ("inputs", "targets"))
    expected = hf_loss(load_llama(hf_dir), tokens, targets)
    assert expected > 8.0
    assert record.values[1] == pytest.approx(expected, rel=1e-4)
    assert driver.options.settings["model_spec"]["num_kv_heads"] == 2


def test_export_scanned_checkpoint_loads_in_transformers_with_the_runs_loss(tmp_path):
    """Two steps, saved after the first: the exported model's loss on the second batch is
    the loss MaxText logged at step 2 (computed with the step-1 weights)."""
    from baton.backends.maxtext.byte_stream import TextBatches, TextCorpus
    from baton.tools.export import main as export_main

    hf_dir = save_tiny_llama(tmp_path / "hf", vocab_size=512, initializer_range=0.3)
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "2", "--save-every", "1",
        "--no-async-save", "--log-every", "1", "--eval-every", "0",
        "--batch-size", str(BATCH), "--seq-len", str(SEQ),
        "--run-dir", str(tmp_path / "run"), "--no-progress", "--overrides", "dtype=float32",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--format", "hf"]) == 0
    batch = nth_batch(TextBatches(TextCorpus.load(None).train, batch_size=BATCH, seq_len=SEQ), 1)
    tokens, targets = (torch.from_numpy(batch[k]).long() for k in ("inputs", "targets"))
    exported = hf_loss(load_llama(tmp_path / "out"), tokens, targets)
    assert record.values[2] == pytest.approx(exported, rel=1e-4)
    assert exported != pytest.approx(hf_loss(load_llama(hf_dir), tokens, targets), rel=1e-4)


def test_a_4096_id_tokenizer_trains_with_no_other_flag(tmp_path):
    """The model's vocabulary follows the tokenizer (rounded up to a multiple of 128)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "prepared_data", Path(__file__).with_name("prepared_data.py")
    )
    assert spec is not None and spec.loader is not None
    prepared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepared)
    prepared.build(tmp_path / "data", vocab_size=4096)
    record = Losses()
    driver = build_driver(RECIPE, [
        "--tokenizer", str(tmp_path / "data" / "tok"), "--data-path",
        str(tmp_path / "data" / "corpus"), "--max-steps", "2", "--log-every", "1",
        "--save-every", "0", "--no-callback", "checkpoint",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    assert sorted(record.values) == [1, 2]
