"""Tokenized text for every backend: local tokenizers, prepared datasets, blends.

``baton data tokenizer`` / :func:`train_tokenizer` make a Hugging Face tokenizer directory
offline; ``baton data prepare`` tokenizes local text into Megatron's indexed format
(``PREFIX.bin`` + ``PREFIX.idx``, the bytes megatron-core's builder writes) plus a manifest
``PREFIX.json``. This package reads them with numpy alone (the ``tokenizers`` library is
imported only by the tokenizer functions), so every backend can use it without pulling in
another backend's framework.

Example::

    from baton.data import (
        DataError, PreparedDataset, check_model_vocab, load_tokenizer, parse_blend,
        train_tokenizer,
    )

    train_tokenizer("runs/tok", vocab_size=1024)   # byte-level BPE on CPython's reference
    tok = load_tokenizer("runs/tok")               # TokenizerInfo
    tok.vocab_size, tok.eod_id, tok.fingerprint    # 1024, 0, sha256 of tokenizer.json
    check_model_vocab(tok, model_vocab_size=1024)  # DataError naming both sizes if too big
    resolve_tokenizer("data/corpus", None)         # the manifest's tokenizer, checked

    # after `baton data prepare corpus.jsonl --tokenizer runs/tok --output data/corpus`
    blend = parse_blend("0.7 data/corpus 0.3 data/code")    # or parse_blend("data/corpus")
    for prefix in blend.prefixes:
        data = PreparedDataset(prefix)             # validated, memory-mapped
        data.check_tokenizer(tok)                  # DataError naming both fingerprints
        data.num_documents, data.num_tokens, data.dtype
        data.document(0)                           # tokens of document 0, eod last
        data.tokens                                # all tokens back to back (np.memmap)
    prefixes, weights = blend.megatron()           # Megatron-Core's GPTDatasetConfig.blend
    blend.maxtext()                                # "data/corpus,0.7;data/code,0.3" (grain mmap)

Every bad input raises :class:`DataError` (a ``ValueError``) whose message names the file
and the fix.
"""

from baton.data.blend import Blend, parse_blend
from baton.data.errors import DataError
from baton.data.indexed import DTYPE_CODES, INDEX_HEADER, PreparedDataset
from baton.data.manifest import (
    MANIFEST_FORMAT,
    Manifest,
    SourceFile,
    check_tokenizer,
    manifest_path,
    read_manifest,
    split_prefix,
)
from baton.data.resolve import prepared_blend, resolve_tokenizer
from baton.data.split import held_out_start, held_out_tokens
from baton.data.tokenizer import (
    END_OF_TEXT,
    PAD,
    TokenizerInfo,
    check_model_vocab,
    fingerprint_file,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "DTYPE_CODES",
    "END_OF_TEXT",
    "INDEX_HEADER",
    "MANIFEST_FORMAT",
    "PAD",
    "Blend",
    "DataError",
    "Manifest",
    "PreparedDataset",
    "SourceFile",
    "TokenizerInfo",
    "check_model_vocab",
    "check_tokenizer",
    "fingerprint_file",
    "held_out_start",
    "held_out_tokens",
    "load_tokenizer",
    "manifest_path",
    "parse_blend",
    "prepared_blend",
    "read_manifest",
    "resolve_tokenizer",
    "split_prefix",
    "train_tokenizer",
]
