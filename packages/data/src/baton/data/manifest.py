"""``PREFIX.json``: what a prepared dataset holds and which tokenizer made it.

``baton data prepare`` writes it next to ``PREFIX.bin``/``PREFIX.idx``. A run checks it
against its own tokenizer, so data tokenized with one vocabulary never trains a model
with another.

Example::

    from baton.data import check_tokenizer, load_tokenizer, read_manifest

    manifest = read_manifest("data/corpus")        # None for data without a manifest
    manifest.documents, manifest.tokens, manifest.tokenizer_fingerprint
    check_tokenizer("data/corpus", load_tokenizer("runs/tok"))   # DataError on a mismatch
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from baton.data.errors import DataError
from baton.data.tokenizer import TokenizerInfo

#: the ``format`` field of manifests this code writes and reads
MANIFEST_FORMAT = "baton-prepared-data/1"


def split_prefix(path: str | Path) -> str:
    """The dataset prefix of ``path``: a trailing ``.bin``/``.idx``/``.json`` is dropped."""
    text = str(path)
    for suffix in (".bin", ".idx", ".json"):
        if text.endswith(suffix):
            return text[: -len(suffix)]
    return text


def manifest_path(prefix: str | Path) -> Path:
    return Path(split_prefix(prefix) + ".json")


@dataclass(frozen=True)
class SourceFile:
    """One input of ``prepare``: its path as given, size in bytes, documents and tokens."""

    path: str
    bytes: int
    documents: int
    tokens: int


@dataclass(frozen=True)
class Manifest:
    """The content of ``PREFIX.json``."""

    tokenizer_fingerprint: str
    tokenizer_path: str
    vocab_size: int
    eod_token: str
    eod_id: int
    dtype: str
    documents: int
    tokens: int
    sources: tuple[SourceFile, ...] = ()
    #: input documents with no text, left out
    skipped_empty: int = 0
    text_key: str | None = None
    format: str = field(default=MANIFEST_FORMAT)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tokenizer": {
                "fingerprint": self.tokenizer_fingerprint,
                "path": self.tokenizer_path,
                "vocab_size": self.vocab_size,
                "eod_token": self.eod_token,
                "eod_id": self.eod_id,
            },
            "dtype": self.dtype,
            "documents": self.documents,
            "tokens": self.tokens,
            "skipped_empty_documents": self.skipped_empty,
            "text_key": self.text_key,
            "sources": [asdict(source) for source in self.sources],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        tokenizer = data["tokenizer"]
        return cls(
            tokenizer_fingerprint=str(tokenizer["fingerprint"]),
            tokenizer_path=str(tokenizer.get("path", "")),
            vocab_size=int(tokenizer["vocab_size"]),
            eod_token=str(tokenizer["eod_token"]),
            eod_id=int(tokenizer["eod_id"]),
            dtype=str(data["dtype"]),
            documents=int(data["documents"]),
            tokens=int(data["tokens"]),
            sources=tuple(SourceFile(**source) for source in data.get("sources", [])),
            skipped_empty=int(data.get("skipped_empty_documents", 0)),
            text_key=data.get("text_key"),
            format=str(data["format"]),
        )

    def dumps(self) -> str:
        """The manifest as JSON text (stable key order, so equal manifests are equal bytes)."""
        return json.dumps(self.to_json(), indent=2) + "\n"


def read_manifest(prefix: str | Path) -> Manifest | None:
    """The manifest of a prepared dataset, or None if it has none (other tools' data)."""
    path = manifest_path(prefix)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not str(data.get("format", "")).startswith("baton-prepared-data/"):
            raise KeyError("format")
        return Manifest.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DataError(
            f"{path} is not a baton data manifest ({type(error).__name__}: {error}); "
            "prepare the data again, or remove the file to use the data unchecked"
        ) from None


def check_tokenizer(prefix: str | Path, tokenizer: TokenizerInfo) -> Manifest | None:
    """Raise :class:`DataError` if ``prefix`` was prepared with a different tokenizer.

    Returns the manifest (None for data without one, which cannot be checked).
    """
    manifest = read_manifest(prefix)
    if manifest is None:
        return None
    if manifest.tokenizer_fingerprint != tokenizer.fingerprint:
        raise DataError(
            f"{split_prefix(prefix)} was prepared with tokenizer {manifest.tokenizer_path} "
            f"(fingerprint {manifest.tokenizer_fingerprint[:16]}), but this run uses "
            f"{tokenizer.path} (fingerprint {tokenizer.fingerprint[:16]}); pass the same "
            "tokenizer, or prepare the data again with this one"
        )
    return manifest
