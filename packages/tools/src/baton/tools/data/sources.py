"""The inputs of ``baton data prepare``: local text files, JSON Lines, Parquet, saved datasets.

Example::

    from baton.tools.data.sources import open_sources

    for source in open_sources(["notes.txt", "web.jsonl"], text_key="text"):
        for text in source.documents():
            ...

* ``.txt``: UTF-8 text; the whole file is one document (``txt_split="file"``), or one per
  paragraph (blank-line separated, ``"paragraph"``), or one per line (``"line"``).
* ``.jsonl`` / ``.json``: JSON Lines, one object per line; the document is ``text_key``.
* ``.parquet``: the ``text_key`` column, read in batches with pyarrow.
* a directory written by ``datasets.Dataset.save_to_disk``: its ``text_key`` column.

Every problem (a missing file, a missing key, bytes that are not UTF-8, a line that is
not JSON) raises :class:`~baton.data.DataError` naming the file and line.
A null value counts as an empty document; empty documents are left out by ``prepare``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.data import DataError

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
TXT_SPLITS = ("file", "paragraph", "line")


def _not_utf8(path: Path, error: UnicodeDecodeError, where: str = "") -> DataError:
    return DataError(
        f"{path}{where} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset "
        f"{error.start}); convert it, e.g. `iconv -f latin1 -t utf-8 {path.name} > fixed`"
    )


@dataclass(frozen=True)
class Source:
    """One input: its path as given, kind (txt, jsonl, parquet, dataset) and size in bytes."""

    path: Path
    kind: str
    size: int
    text_key: str
    txt_split: str = "file"

    def documents(self) -> Iterator[str]:
        """The documents' texts in file order (a null value gives ``""``)."""
        reader = {
            "txt": self._txt,
            "jsonl": self._jsonl,
            "parquet": self._parquet,
            "dataset": self._dataset,
        }[self.kind]
        return reader()

    def _txt(self) -> Iterator[str]:
        try:
            text = self.path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise _not_utf8(self.path, error) from None
        if self.txt_split == "file":
            yield text
        elif self.txt_split == "line":
            yield from text.splitlines()
        else:
            paragraph: list[str] = []
            for line in text.splitlines():
                if line.strip():
                    paragraph.append(line)
                elif paragraph:
                    yield "\n".join(paragraph)
                    paragraph = []
            if paragraph:
                yield "\n".join(paragraph)

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(where, record)`` of every row in file order: ``where`` names the file and line
        (or row) for messages; for JSON Lines, Parquet and saved datasets only."""
        if self.kind == "txt":
            raise DataError(
                f"{self.path} is plain text; conversations and preference pairs come as "
                ".jsonl, .parquet or a saved dataset directory"
            )
        if self.kind == "jsonl":
            yield from self._json_records()
            return
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            try:
                batches = pq.ParquetFile(self.path).iter_batches(batch_size=1024)
                rows = (row for batch in batches for row in batch.to_pylist())
            except Exception as error:
                raise DataError(f"{self.path} is not a Parquet file ({error})") from None
        else:
            rows = self._dataset_rows()
        for number, row in enumerate(rows, start=1):
            yield f"{self.path} row {number}", row

    def _dataset_rows(self) -> Iterator[dict[str, Any]]:
        import datasets

        dataset = datasets.load_from_disk(str(self.path))
        if not isinstance(dataset, datasets.Dataset):
            raise DataError(
                f"{self.path} holds several splits ({', '.join(map(str, dataset))}); pass one "
                "split's directory, e.g. the train/ folder inside it"
            )
        for row in dataset:
            yield dict(row)  # type: ignore[arg-type]

    def _json_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        with open(self.path, "rb") as stream:
            for number, raw in enumerate(stream, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise _not_utf8(self.path, error, f" line {number}") from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise DataError(
                        f"{self.path} line {number} is not JSON ({error}); give JSON Lines, "
                        "one object per line"
                    ) from None
                if not isinstance(record, dict):
                    raise DataError(
                        f"{self.path} line {number} is a {type(record).__name__}, not a JSON "
                        "object; give JSON Lines, one object per line"
                    )
                yield f"{self.path} line {number}", record

    def _jsonl(self) -> Iterator[str]:
        for where, record in self._json_records():
            yield self._field(record, where)

    def _field(self, record: dict, where: str) -> str:
        if self.text_key not in record:
            keys = ", ".join(sorted(map(str, record))) or "none"
            raise DataError(
                f"{where} has no key {self.text_key!r} (its keys: {keys}); "
                "pass --text-key with the key that holds the text"
            )
        value = record[self.text_key]
        if value is None:
            return ""
        if not isinstance(value, str):
            raise DataError(
                f"{where}: {self.text_key!r} is a {type(value).__name__}, not text; "
                "pass --text-key with the key that holds the text"
            )
        return value

    def _column_check(self, columns: Sequence[str], what: str) -> None:
        if self.text_key not in columns:
            raise DataError(
                f"{self.path} has no column {self.text_key!r} (its {what}: "
                f"{', '.join(columns) or 'none'}); pass --text-key with the text column"
            )

    def _parquet(self) -> Iterator[str]:
        import pyarrow.parquet as pq

        try:
            file = pq.ParquetFile(self.path)
        except Exception as error:
            raise DataError(f"{self.path} is not a Parquet file ({error})") from None
        self._column_check(file.schema_arrow.names, "columns")
        for batch in file.iter_batches(columns=[self.text_key], batch_size=1024):
            for value in batch.column(0).to_pylist():
                yield self._value(value)

    def _value(self, value: object) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise DataError(
                f"{self.path}: column {self.text_key!r} holds {type(value).__name__}, not "
                "text; pass --text-key with the text column"
            )
        return value

    def _dataset(self) -> Iterator[str]:
        import datasets

        dataset = datasets.load_from_disk(str(self.path))
        if not isinstance(dataset, datasets.Dataset):  # a DatasetDict of splits
            raise DataError(
                f"{self.path} holds several splits ({', '.join(map(str, dataset))}); pass one split's "
                "directory, e.g. the train/ folder inside it"
            )
        self._column_check(list(dataset.column_names), "columns")
        for batch in dataset.select_columns([self.text_key]).iter(batch_size=1024):
            rows: dict[str, list[Any]] = dict(batch)  # column -> values
            for value in rows[self.text_key]:
                yield self._value(value)


def _kind(path: Path) -> str:
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise DataError(
                f"{path} holds several splits ({', '.join(splits)}); pass one of them, "
                f"e.g. {path / (splits[0] if splits else 'train')}"
            )
        if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
            return "dataset"
        raise DataError(
            f"{path} is a directory but not a dataset saved with `save_to_disk`; pass "
            ".txt, .jsonl or .parquet files, or a saved dataset directory"
        )
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "txt"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise DataError(
        f"{path}: unknown input type {suffix or '(no suffix)'!r}; pass .txt, .jsonl, "
        ".parquet files or a dataset directory written by `save_to_disk`"
    )


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file())
    return path.stat().st_size


def open_sources(
    inputs: Sequence[str | Path], text_key: str = "text", txt_split: str = "file"
) -> list[Source]:
    """Check every input exists and has a known type before anything is read."""
    if not inputs:
        raise DataError("no inputs; pass .txt, .jsonl, .parquet files or saved dataset dirs")
    if txt_split not in TXT_SPLITS:
        raise DataError(f"txt split {txt_split!r} is not one of {', '.join(TXT_SPLITS)}")
    sources = []
    for name in inputs:
        path = Path(name)
        if not path.exists():
            raise DataError(f"input {path} does not exist; check the path")
        sources.append(Source(path, _kind(path), _size(path), text_key, txt_split))
    return sources
