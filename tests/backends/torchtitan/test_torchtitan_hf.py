"""One model, TorchTitan: a Hugging Face Llama (``config.json`` + weights) built by
TorchTitan's own llama3 model and state-dict adapter, trained through baton, exported back.

A tiny ``LlamaForCausalLM`` saved here (GQA, SwiGLU, untied) is the source. The recipe
``recipes/torchtitan_llama3_debug.py --init-from HF_DIR`` must start from exactly that
function (first loss equal to the transformers model's on the same batch), record the
spec, export to a directory ``transformers`` loads with the same logits, and refuse a
different architecture by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")

import torch

from baton.core.cli.recipe import build_driver
from baton.core.errors import UsageError
from support.recording import Losses
from support.tiny_llama import hf_loss, load_llama, save_tiny_llama
from support.titan_batches import first_byte_batch
from support.titan_model import sdpa_model

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"
SEQ, BATCH, VOCAB = 64, 2, 512


def _titan_logits(spec: Any, weights: dict[str, torch.Tensor], tokens: torch.Tensor) -> Any:
    """TorchTitan's model for ``spec`` (SDPA, as on CPU) with ``weights``: its logits."""

    from baton.backends.torchtitan.hf import model_config

    config = model_config(spec)
    with torch.no_grad():
        return sdpa_model(config, weights)(tokens)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``--init-from`` a tiny HF Llama, 2 steps on bytes, saved at the end."""
    root = tmp_path_factory.mktemp("titan_hf")
    hf_dir = save_tiny_llama(root / "hf", vocab_size=VOCAB)
    record = Losses()
    driver = build_driver(RECIPE, [
        "--init-from", str(hf_dir), "--max-steps", "2", "--seq-len", str(SEQ),
        "--batch-size", str(BATCH), "--log-every", "1", "--save-every", "2",
        "--run-dir", str(root / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    return {"hf_dir": hf_dir, "run_dir": root / "run", "losses": record.values, "driver": driver}


def test_init_from_hf_first_loss_equals_transformers(hf_run):
    tokens, labels = first_byte_batch(SEQ, BATCH)
    expected = hf_loss(load_llama(hf_run["hf_dir"]), tokens, labels)
    assert hf_run["losses"][1] == pytest.approx(expected, rel=1e-4)
    spec = hf_run["driver"].options.settings["model_spec"]
    assert (spec["vocab_size"], spec["num_kv_heads"], spec["ffn_hidden_size"]) == (VOCAB, 2, 176)


def test_export_loads_in_transformers_with_equal_logits(hf_run, tmp_path):
    from baton.backends.torchtitan.export import dcp_folder, read_model_weights
    from baton.core.model.spec import LlamaSpec
    from baton.tools.export import main as export_main

    checkpoint = hf_run["run_dir"] / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = load_llama(tmp_path / "hf")
    assert LlamaSpec.from_hf(tmp_path / "hf") == LlamaSpec.from_hf(hf_run["hf_dir"])
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    spec = LlamaSpec.from_hf(hf_run["hf_dir"])
    expected = _titan_logits(spec, read_model_weights(dcp_folder(checkpoint)), tokens)
    with torch.no_grad():
        got = exported(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_resume_or_init_with_another_architecture_is_refused_by_field(hf_run, tmp_path):
    other = save_tiny_llama(tmp_path / "other", vocab_size=VOCAB, num_hidden_layers=3)
    with pytest.raises(UsageError, match="num_layers is 2 there, 3 here"):
        build_driver(RECIPE, [
            "--model-config", str(other), "--resume", "auto",
            "--run-dir", str(hf_run["run_dir"]), "--max-steps", "3",
        ]).fit()  # fmt: skip
    with pytest.raises(UsageError, match="num_layers is 2 there, 3 here"):
        build_driver(RECIPE, [
            "--model-config", str(other), "--init-from", str(hf_run["hf_dir"]),
        ])  # fmt: skip


def test_a_vocabulary_changed_by_set_alone_is_refused_before_build(tmp_path):
    from baton.backends.torchtitan import TorchTitanBackend
    from baton.backends.torchtitan.configs import llama3_debug

    config = llama3_debug(dump_folder=str(tmp_path))
    config.model_spec.model.vocab_size = 4096
    with pytest.raises(UsageError, match="vocabulary sizes disagree"):
        TorchTitanBackend(config).setup()


def test_a_4096_id_tokenizer_trains_with_no_other_flag(tmp_path):
    """The debug model's vocabulary follows ``--tokenizer`` (it has 2,048 rows)."""
    from baton.backends.torchtitan.hf import tokenizer_vocab
    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents

    tokenizer = str(train_tokenizer(tmp_path / "tok", vocab_size=4096).path)
    assert tokenizer_vocab(tokenizer) == 4096
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(reference_documents()[:50]))
    record = Losses()
    driver = build_driver(RECIPE, [
        "--tokenizer", tokenizer, "--data-path", str(text), "--max-steps", "2",
        "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--log-every", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
    ])  # fmt: skip
    driver.callbacks.append(record)
    driver.fit()
    assert sorted(record.values) == [1, 2] and all(v == v for v in record.values.values())
    # the export carries the run's tokenizer: AutoTokenizer loads it from the export folder
    from transformers import AutoTokenizer

    from baton.tools.export import main as export_main

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert len(AutoTokenizer.from_pretrained(tmp_path / "hf")) == 4096
    assert load_llama(tmp_path / "hf").config.vocab_size == 4096
