"""Shared inputs for the data tools' tests: one small tokenizer, one small corpus in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.data import TokenizerInfo, train_tokenizer
from baton.data.corpus import reference_documents


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TokenizerInfo:
    """A 512-token byte-level BPE trained offline on CPython's language reference."""
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "bpe", vocab_size=512)


@pytest.fixture(scope="session")
def documents() -> list[str]:
    """40 real documents (the reference's first topics, cut to 1,500 characters), plus Unicode."""
    docs = [text[:1500] for text in reference_documents()[:40]]
    docs.append("Unicode stays intact: é, ß, 東京, emoji 🙂, and a tab\tthen the end.")
    return docs


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory, documents: list[str]) -> dict[str, Path]:
    """The same documents as JSON Lines, Parquet, a saved `datasets` dataset, and .txt files."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("corpus")
    files = {"jsonl": root / "docs.jsonl", "parquet": root / "docs.parquet"}
    with open(files["jsonl"], "w", encoding="utf-8") as stream:
        for number, text in enumerate(documents):
            stream.write(json.dumps({"id": number, "content": text}) + "\n")
    table = pa.table({"id": list(range(len(documents))), "content": documents})
    pq.write_table(table, files["parquet"], row_group_size=16)
    files["dataset"] = root / "saved"
    datasets.Dataset.from_dict({"content": documents}).save_to_disk(str(files["dataset"]))
    # one .txt file per line-free document: a whole .txt file is one document
    files["txt"] = root / "one.txt"
    files["txt"].write_text(documents[-1], encoding="utf-8")
    return files
