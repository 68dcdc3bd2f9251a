"""The text every CPU recipe trains on, available offline on any machine.

By default it is the Python language reference that ships with every CPython
(``pydoc_data.topics``: 79 topics, about 490 kB of English prose and grammar); a
path reads any UTF-8 text file instead. Backends tokenize it their own way (bytes).

Example::

    from baton.data.corpus import load_text, reference_documents

    source, text = load_text(None)        # ("pydoc_data.topics (Python language reference)", "...")
    docs = reference_documents()          # one string per topic, in a fixed order
"""

from __future__ import annotations

from pathlib import Path

from baton.core.errors import UsageError
from baton.data.errors import DataError

REFERENCE = "pydoc_data.topics (Python language reference)"


class MissingDataFile(DataError, FileNotFoundError):
    """A data file that is not there: a usage error (exit status 2, the run refused before
    it trains), still a ``FileNotFoundError`` for code that catches that."""


def reference_documents() -> list[str]:
    """The Python language reference, one document per topic, sorted by topic name."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def read_text(path: str | Path, what: str = "data_path") -> str:
    """A UTF-8 text file's content; a missing file names the setting to fix."""
    file = Path(path)
    if not file.is_file() and all(Path(f"{file}{end}").is_file() for end in (".bin", ".idx")):
        raise UsageError(
            f"{what} {str(file)!r} is a prepared dataset ({file.name}.bin, {file.name}.idx): "
            "give the tokenizer it was prepared with, --tokenizer DIR"
        )
    if not file.is_file():
        raise MissingDataFile(
            f"{what} {str(file)!r} is not a file; give a UTF-8 text file, or leave it unset "
            "for the built-in Python language reference"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{what} {str(file)!r} is not UTF-8 text ({error.reason} at byte {error.start}); "
            "give a UTF-8 text file"
        ) from None
    if not text.strip():
        raise ValueError(f"{what} {str(file)!r} is empty; give a UTF-8 text file with content")
    return text


def load_text(path: str | Path | None, what: str = "data_path") -> tuple[str, str]:
    """``(source, text)``: the reference's topics joined by blank lines, or the file's text."""
    if path is None:
        return REFERENCE, "\n\n".join(reference_documents())
    return str(path), read_text(path, what)
