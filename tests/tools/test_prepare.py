"""`baton data prepare`: every input format, identical tokens for every reader, same bytes twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baton.data import PreparedDataset, TokenizerInfo, read_manifest
from baton.tools.data.prepare import prepare


def expected_tokens(tokenizer: TokenizerInfo, documents: list[str]) -> list[list[int]]:
    """What prepare must write: each document's ids, then the end-of-document id."""
    return [[*tokenizer.tokenizer.encode(text).ids, tokenizer.eod_id] for text in documents]


def files_of(prefix: Path) -> list[str]:
    return sorted(p.name for p in prefix.parent.glob(prefix.name + "*"))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tokenizer, corpus) -> dict[str, Path]:
    """The JSON Lines corpus prepared twice in one process, and once by the CLI with 2 workers."""
    root = tmp_path_factory.mktemp("prepared")
    out = {"first": root / "first", "second": root / "second", "cli": root / "cli"}
    for name in ("first", "second"):
        prepare([corpus["jsonl"]], tokenizer, out[name], text_key="content", workers=1)
    command = [
        sys.executable, "-m", "baton.core.cli.command", "data", "prepare", str(corpus["jsonl"]),
        "--tokenizer", str(tokenizer.path), "--output", str(out["cli"]),
        "--text-key", "content", "--workers", "2",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "41 documents" in run.stdout
    return out


def test_same_input_gives_the_same_bytes_whatever_the_workers(prepared) -> None:
    for suffix in (".bin", ".idx", ".json"):
        first = (prepared["first"].parent / (prepared["first"].name + suffix)).read_bytes()
        for other in ("second", "cli"):
            path = prepared[other].parent / (prepared[other].name + suffix)
            assert path.read_bytes() == first, f"{path} differs from the first run"
    assert files_of(prepared["first"]) == ["first.bin", "first.idx", "first.json"]


@pytest.mark.filterwarnings("ignore:Could not determine rank")
def test_megatron_maxtext_and_baton_read_identical_tokens(prepared, tokenizer, documents):
    from maxtext.input_pipeline._mmap_datasource import MMapIndexedDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = str(prepared["cli"])
    expected = expected_tokens(tokenizer, documents)
    ours = PreparedDataset(prefix)
    megatron = IndexedDataset(prefix)
    maxtext = MMapIndexedDataset(prefix)
    assert len(ours) == len(megatron) == len(maxtext) == len(documents)
    assert ours.num_documents == len(documents)
    assert ours.dtype == np.uint16 and megatron.index.dtype == np.uint16
    for index, tokens in enumerate(expected):
        assert ours[index].tolist() == tokens
        assert ours.document(index).tolist() == tokens
        assert megatron[index].tolist() == tokens
        assert maxtext[index].tolist() == tokens
    assert ours.tokens.tolist() == [t for doc in expected for t in doc]
    assert ours.get(3, offset=2, length=5).tolist() == expected[3][2:7]
    assert megatron.document_indices.tolist() == ours.document_indices.tolist()
    # the text comes back: decoding a document gives the document and the eod token
    decoded = tokenizer.tokenizer.decode(ours.document(40).tolist(), skip_special_tokens=False)
    assert decoded == documents[40] + tokenizer.eod_token


def test_manifest_records_tokenizer_counts_and_sources(prepared, tokenizer, corpus):
    manifest = read_manifest(prepared["cli"])
    assert manifest is not None
    assert manifest.tokenizer_fingerprint == tokenizer.fingerprint
    assert (manifest.vocab_size, manifest.eod_id, manifest.dtype) == (512, 0, "uint16")
    data = PreparedDataset(prepared["cli"])
    assert (manifest.documents, manifest.tokens) == (data.num_documents, data.num_tokens)
    (source,) = manifest.sources
    assert source.path == str(corpus["jsonl"])
    assert source.bytes == corpus["jsonl"].stat().st_size
    assert (source.documents, source.tokens) == (manifest.documents, manifest.tokens)
    assert data.check_tokenizer(tokenizer) == manifest


@pytest.mark.parametrize("kind", ["parquet", "dataset"])
def test_parquet_and_saved_datasets_give_the_jsonl_tokens(
    prepared, tokenizer, corpus, kind, tmp_path
):
    prepare([corpus[kind]], tokenizer, tmp_path / kind, text_key="content", workers=1)
    assert (tmp_path / f"{kind}.bin").read_bytes() == (
        prepared["first"].parent / "first.bin"
    ).read_bytes()
    assert (tmp_path / f"{kind}.idx").read_bytes() == (
        prepared["first"].parent / "first.idx"
    ).read_bytes()


def test_text_files_split_into_documents_and_sources_keep_their_order(tokenizer, corpus, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("first line\nsecond line\n\n\nthird paragraph\nstill third\n", encoding="utf-8")
    cases = {
        "file": [text.read_text(encoding="utf-8")],
        "paragraph": ["first line\nsecond line", "third paragraph\nstill third"],
        "line": ["first line", "second line", "third paragraph", "still third"],
    }
    for split, docs in cases.items():
        manifest = prepare([text], tokenizer, tmp_path / split, txt_split=split, workers=1)
        data = PreparedDataset(tmp_path / split)
        assert [data.document(i).tolist() for i in range(len(data))] == expected_tokens(
            tokenizer, docs
        )
        assert manifest.skipped_empty == (2 if split == "line" else 0)  # two blank lines
    # several inputs of different kinds: documents in input order
    prepare([text, corpus["txt"]], tokenizer, tmp_path / "both", workers=1)
    both = PreparedDataset(tmp_path / "both")
    docs = [text.read_text(encoding="utf-8"), corpus["txt"].read_text(encoding="utf-8")]
    assert [both.document(i).tolist() for i in range(2)] == expected_tokens(tokenizer, docs)
    assert [s.path for s in read_manifest(tmp_path / "both").sources] == [
        str(text),
        str(corpus["txt"]),
    ]


def test_a_large_vocabulary_is_written_as_int32(tmp_path) -> None:
    """A vocabulary past uint16 (70,000 words) goes to int32 and reads back the same."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from baton.data import load_tokenizer

    vocab = {"<|endoftext|>": 0, "[UNK]": 1} | {f"w{i}": i + 2 for i in range(70_000)}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "tok").mkdir()
    word_level.save(str(tmp_path / "tok" / "tokenizer.json"))
    big = load_tokenizer(tmp_path / "tok")
    assert (big.vocab_size, big.eod_id) == (70_002, 0)
    (tmp_path / "words.txt").write_text("w1 w69999 unknown w65600", encoding="utf-8")
    manifest = prepare([tmp_path / "words.txt"], big, tmp_path / "big", workers=1)
    assert manifest.dtype == "int32"
    assert PreparedDataset(tmp_path / "big")[0].tolist() == [3, 70001, 1, 65602, 0]


def test_inspect_prints_counts_manifest_and_decoded_documents(
    prepared, tokenizer, documents, capsys
):
    from baton.tools.data.cli import main

    assert main(["inspect", str(prepared["cli"]), "-n", "2", "--chars", "60"]) == 0
    out = capsys.readouterr().out
    data = PreparedDataset(prepared["cli"])
    assert f"documents  {len(documents)}" in out
    assert f"tokens     {data.num_tokens:,}" in out
    assert "dtype      uint16" in out
    assert f"fingerprint {tokenizer.fingerprint[:16]}" in out
    assert f"--- document 1: {len(data.document(1)):,} tokens" in out
    assert (
        documents[0][:60] in out and documents[1][:60] in out
    )  # decoded with the manifest's tokenizer
    assert "document 2" not in out
    # without a manifest and a tokenizer: the ids, and how to decode them
    for suffix in (".bin", ".idx"):
        (prepared["cli"].parent / f"bare{suffix}").write_bytes(
            Path(f"{prepared['cli']}{suffix}").read_bytes()
        )
    assert main(["inspect", str(prepared["cli"].parent / "bare"), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "manifest   none" in out and "pass --tokenizer DIR to decode" in out
    assert " ".join(map(str, data.document(0)[:10].tolist())) in out
