"""A real tokenizer and a prepared dataset for MaxText's own pipelines, built locally.

    python prepared_data.py OUT_DIR     # OUT_DIR/tok (HF tokenizer), OUT_DIR/corpus.{bin,idx,json}

The tokenizer is a byte-level BPE trained with ``tokenizers`` on the Python language
reference (``baton.data.train_tokenizer``); the dataset is every topic of
that text tokenized, end-of-document appended, written by megatron-core's
``IndexedDatasetBuilder`` with a baton manifest (tokenizer fingerprint, counts). It runs
in its own process so that the test process never imports torch (megatron-core needs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def build(out: Path, vocab_size: int = 512) -> tuple[Path, Path]:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from baton.data import Manifest, SourceFile, train_tokenizer
    from baton.data.corpus import reference_documents

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(out / "tok", vocab_size=vocab_size)
    prefix = out / "corpus"
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    documents = tokens = 0
    texts = [t for t in reference_documents() if t.strip()]
    for encoding in tok.tokenizer.encode_batch(texts):
        ids = np.array([*encoding.ids, tok.eod_id], dtype=np.uint16)
        builder.add_document(ids, [len(ids)])
        documents += 1
        tokens += len(ids)
    builder.finalize(str(prefix) + ".idx")
    manifest = Manifest(
        tokenizer_fingerprint=tok.fingerprint,
        tokenizer_path=str(tok.path),
        vocab_size=tok.vocab_size,
        eod_token=tok.eod_token,
        eod_id=tok.eod_id,
        dtype="uint16",
        documents=documents,
        tokens=tokens,
        sources=(SourceFile("pydoc_data.topics", 0, documents, tokens),),
    )
    Path(str(prefix) + ".json").write_text(manifest.dumps())
    return out / "tok", prefix


if __name__ == "__main__":
    tok_dir, data_prefix = build(Path(sys.argv[1]))
    print(tok_dir, data_prefix)
