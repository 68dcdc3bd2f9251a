"""``--eval-every`` and ``baton eval`` on the run's own data: a held-out split of the
training data (``--eval-split``: its last documents, ``baton.data.held_out_start``) or an
evaluation file (``--eval-data-path``), read by each engine natively. A 2-step run logs
``eval/loss`` and ``baton eval`` of its checkpoint prints the same value (same weights,
same held-out data). The slow tests spawn two processes each (~30-60 s per engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.data import DataError, PreparedDataset, held_out_start, held_out_tokens
from support.eval_runs import train_then_eval

VOCAB = 512


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BPE tokenizer, ``corpus.jsonl`` (the Python reference, a document a line) and
    ``corpus.bin/.idx`` prepared from it, and ``eval.jsonl`` (its first 8 records, also prepared as ``eval``)."""
    import json

    from baton.data import train_tokenizer
    from baton.data.corpus import reference_documents
    from baton.tools.data.prepare import prepare

    directory = tmp_path_factory.mktemp("data")
    tokenizer = train_tokenizer(directory / "tokenizer", vocab_size=VOCAB)
    with open(directory / "corpus.jsonl", "w", encoding="utf-8") as out:
        for doc in reference_documents():
            if doc.strip():
                out.write(json.dumps({"text": doc}) + "\n")
    prepare([directory / "corpus.jsonl"], tokenizer, directory / "corpus", workers=1)
    lines = (directory / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    (directory / "eval.jsonl").write_text("\n".join(lines[:8]) + "\n", encoding="utf-8")
    prepare([directory / "eval.jsonl"], tokenizer, directory / "eval", workers=1)
    return directory


def test_held_out_start_is_the_last_documents():
    assert held_out_start(1000, 0.05) == 950
    assert held_out_start(10, 0.01) == 9  # at least one document
    assert held_out_start(10, 0) == 10  # nothing held out
    with pytest.raises(DataError, match="leaves none to train on"):
        held_out_start(1, 0.5)
    with pytest.raises(DataError, match="--eval-split"):
        held_out_start(10, 1.5)


def test_torchtitan_prepared_split_cuts_at_a_document(data):
    """The training and held-out token ranges of a prepared prefix meet at the first
    held-out document and cover every token once."""
    from baton.backends.torchtitan.prepared import split_tokens

    prepared = PreparedDataset(data / "corpus")
    train = split_tokens(prepared, 0.05, "train")
    held = split_tokens(prepared, 0.05, "eval")
    first = held_out_start(prepared.num_documents, 0.05)
    assert train == (0, sum(len(prepared.document(i)) for i in range(first)))
    assert train[1] == held_out_tokens(prepared, 0.05)
    assert held == (train[1], prepared.num_tokens)
    assert split_tokens(prepared, 0, "eval") == (0, prepared.num_tokens)


def test_torchtitan_jsonl_split_keeps_the_last_records(data):
    """TorchTitan's Hugging Face loader, registered with the split, reads the last records."""
    from torchtitan.hf_datasets.text_datasets import DATASETS

    from baton.backends.torchtitan.data import register_local_dataset

    path = str(data / "corpus.jsonl")
    name = register_local_dataset(path, eval_split=0.05, split="eval")
    held = DATASETS[name].loader(path)
    records = DATASETS[register_local_dataset(path)].loader(path)
    assert len(held) == len(records) - held_out_start(len(records), 0.05)
    assert held[len(held) - 1]["text"] == records[len(records) - 1]["text"]


def test_torchtitan_finite_passes_read_as_many_windows_on_every_rank(data):
    """The validator's finite pass (steps=-1) over baton's loaders: every data-parallel
    rank reads the same number of windows, so none waits for another at the end."""
    from baton.backends.torchtitan.data import ByteBosEosTokenizer, PackedTextDataset
    from baton.backends.torchtitan.prepared import PreparedWindows

    documents = ["a" * 300, "b" * 40, "c" * 90, "d" * 500, "e" * 10]
    counts = [
        len(list(PackedTextDataset(documents, ByteBosEosTokenizer(), seq_len=32, dp_rank=r,
                                   dp_world_size=2, infinite=False)))
        for r in range(2)
    ]  # fmt: skip
    assert counts[0] == counts[1] > 0
    prepared = PreparedDataset(data / "eval")
    windows = [
        len(list(PreparedWindows(prepared, eod_id=0, seq_len=64, dp_rank=r, dp_world_size=3,
                                 infinite=False)))
        for r in range(3)
    ]  # fmt: skip
    assert windows[0] == windows[1] == windows[2] > 0


def test_torchtitan_eval_every_without_held_out_data_is_one_line():
    from baton.core.cli.recipe import build_driver
    from baton.core.errors import UsageError

    with pytest.raises(UsageError, match="--eval-split"):
        build_driver("recipes/torchtitan_llama3_debug.py", ["--eval-every", "2"])


@pytest.mark.slow
@pytest.mark.parametrize("source", ["prepared_split", "jsonl_file"])
def test_torchtitan_eval_every_and_baton_eval_agree(data, tmp_path, source):
    """TorchTitan's validator on a prepared prefix's held-out documents, or on a local
    .jsonl file given by --eval-data-path (training on the prepared prefix)."""
    common = ["--data-path", str(data / "corpus"), "--tokenizer", str(data / "tokenizer")]
    held = (
        ["--eval-split", "0.05"]
        if source == "prepared_split"
        else ["--eval-data-path", str(data / "eval.jsonl")]
    )
    args = [*common, *held, "--seq-len", "64", "--batch-size", "2"]
    logged, printed = train_then_eval("recipes/torchtitan_llama3_debug.py", args, tmp_path)
    assert printed == pytest.approx(logged, abs=1e-3)


@pytest.mark.slow
def test_megatron_eval_every_and_baton_eval_agree(data, tmp_path):
    """Megatron-Core's validation split holds out the last documents (--eval-split)."""
    args = ["--data-path", str(data / "corpus"), "--tokenizer", str(data / "tokenizer")]
    args += ["--eval-split", "0.05", "--batch-size", "2", "--global-batch-size", "2"]
    logged, printed = train_then_eval("recipes/megatron_gpt_tiny.py", args, tmp_path)
    assert printed == pytest.approx(logged, abs=1e-3)


@pytest.mark.slow
def test_maxtext_eval_every_and_baton_eval_agree(data, tmp_path):
    """MaxText's eval iterator over a prepared evaluation prefix (--eval-data-path)."""
    args = ["--data-path", str(data / "corpus"), "--tokenizer", str(data / "tokenizer")]
    args += ["--eval-data-path", str(data / "eval"), "--batch-size", "2"]
    logged, printed = train_then_eval("recipes/maxtext_tiny.py", args, tmp_path)
    assert printed == pytest.approx(logged, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("held", [["--eval-split", "0.05"], ["--eval-data-path", "eval.jsonl"]])
def test_fabric_eval_every_and_baton_eval_agree(data, tmp_path, held):
    """Fabric's eval_data: the last documents of the prepared prefix, or a .jsonl file."""
    from transformers import LlamaConfig

    model = tmp_path / "model"
    LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
    ).save_pretrained(model)  # fmt: skip
    held = [held[0], str(data / held[1])] if held[0] == "--eval-data-path" else held
    args = ["--model-config", str(model), "--data-path", str(data / "corpus")]
    args += ["--tokenizer", str(data / "tokenizer"), *held, "--batch-size", "2"]
    logged, printed = train_then_eval("recipes/hf_finetune.py", args, tmp_path / "run")
    assert printed == pytest.approx(logged, abs=1e-3)
