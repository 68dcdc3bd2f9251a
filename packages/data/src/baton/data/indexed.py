"""Megatron's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``) read with numpy memory maps.

This is the format ``baton data prepare`` writes (:mod:`baton.data.indexed_writer`) and
that Megatron-Core's ``IndexedDataset``/``GPTDataset`` and MaxText's Grain ``mmap`` source
read. This reader needs only numpy, so any backend can use it.

Example::

    from baton.data import PreparedDataset

    data = PreparedDataset("data/corpus")          # data/corpus.bin + data/corpus.idx
    len(data), data.num_tokens, data.dtype          # sequences (= documents), tokens, uint16
    data[0]                                         # tokens of sequence 0 (a read-only view)
    data.tokens[:4096]                              # every token, documents back to back

``PREFIX.idx`` layout (little-endian): the 9-byte header ``MMIDIDX\\0\\0``, version (u64 = 1),
dtype code (u8), sequence count S (u64), document count D (u64), then S int32 sequence
lengths, S int64 byte offsets into ``.bin``, D int64 document boundaries (sequence indices,
starting at 0), and, for multimodal data only, S int8 modes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from baton.data.errors import DataError
from baton.data.manifest import Manifest, check_tokenizer, read_manifest, split_prefix
from baton.data.tokenizer import TokenizerInfo

INDEX_HEADER = b"MMIDIDX\x00\x00"
#: megatron-core's dtype codes (``megatron.core.datasets.indexed_dataset.DType``)
DTYPE_CODES: dict[int, type[np.number]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_FIXED = len(INDEX_HEADER) + 8 + 1 + 8 + 8  # header, version, dtype code, two counts


def _missing(prefix: str) -> DataError:
    bin_path, idx_path = Path(prefix + ".bin"), Path(prefix + ".idx")
    if bin_path.exists():
        return DataError(
            f"{bin_path} has no index {idx_path}: the data was not prepared completely; "
            f"run `baton data prepare ... --output {prefix}` again"
        )
    if idx_path.exists():
        return DataError(
            f"{idx_path} has no data file {bin_path}; run `baton data prepare ... --output "
            f"{prefix}` again"
        )
    return DataError(
        f"no prepared dataset at {prefix} ({bin_path.name} and {idx_path.name} not found); "
        f"make one with `baton data prepare INPUT... --tokenizer DIR --output {prefix}`"
    )


class PreparedDataset:
    """A prepared dataset ``PREFIX.bin`` + ``PREFIX.idx``, validated and memory-mapped.

    Raises :class:`DataError` naming the file and the fix when the index is missing, its
    header is not Megatron's, it is cut short, or ``.bin`` is shorter or longer than the
    index says.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = split_prefix(prefix)
        self.bin_path = Path(self.prefix + ".bin")
        self.idx_path = Path(self.prefix + ".idx")
        if not (self.bin_path.is_file() and self.idx_path.is_file()):
            raise _missing(self.prefix)
        self._read_index()
        self._open_bin()

    def _read_index(self) -> None:
        path = self.idx_path
        size = path.stat().st_size
        with open(path, "rb") as stream:
            head = stream.read(_FIXED)
        if len(head) < len(INDEX_HEADER) or head[: len(INDEX_HEADER)] != INDEX_HEADER:
            raise DataError(
                f"{path} is not a Megatron indexed-dataset index (its header is "
                f"{head[:9]!r}, not {INDEX_HEADER!r}); prepare the data with `baton data prepare`"
            )
        if len(head) < _FIXED:
            raise DataError(f"{path} is truncated ({size} bytes); prepare the data again")
        version, code, sequences, documents = struct.unpack("<QBQQ", head[len(INDEX_HEADER) :])
        if version != 1:
            raise DataError(f"{path} has index version {version}; only version 1 is known")
        if code not in DTYPE_CODES:
            raise DataError(f"{path} has unknown dtype code {code}; prepare the data again")
        self.dtype: np.dtype = np.dtype(DTYPE_CODES[code])
        expected = _FIXED + sequences * (4 + 8) + documents * 8
        if size < expected:
            raise DataError(
                f"{path} is truncated: {size} bytes, its counts ({sequences} sequences, "
                f"{documents} document boundaries) need {expected}; prepare the data again"
            )
        index = np.memmap(path, mode="r", dtype=np.uint8)
        self._index = index
        self.sequence_lengths: np.ndarray = np.frombuffer(
            index, dtype=np.int32, count=sequences, offset=_FIXED
        )
        self.sequence_pointers: np.ndarray = np.frombuffer(
            index, dtype=np.int64, count=sequences, offset=_FIXED + 4 * sequences
        )
        #: document ``d`` is sequences ``document_indices[d]`` to ``document_indices[d + 1]``
        self.document_indices: np.ndarray = np.frombuffer(
            index, dtype=np.int64, count=documents, offset=_FIXED + 12 * sequences
        )

    def _open_bin(self) -> None:
        size = self.bin_path.stat().st_size
        self.num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        expected = self.num_tokens * self.dtype.itemsize
        if size != expected:
            state = "truncated" if size < expected else "longer than its index says"
            raise DataError(
                f"{self.bin_path} is {state}: {size} bytes, {self.idx_path.name} describes "
                f"{expected} ({self.num_tokens} {self.dtype.name} tokens); prepare the data again"
            )
        if self.num_tokens == 0:
            self.tokens: np.ndarray = np.zeros(0, dtype=self.dtype)
        else:
            #: every token in file order (documents back to back), read-only
            self.tokens = np.memmap(self.bin_path, mode="r", dtype=self.dtype)

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return max(len(self.document_indices) - 1, 0)

    def __len__(self) -> int:
        """The number of sequences (``baton data prepare`` writes one per document)."""
        return self.num_sequences

    def __getitem__(self, index: int) -> np.ndarray:
        """The tokens of sequence ``index`` (a read-only view into ``.bin``)."""
        return self.get(index)

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset:offset+length`` of sequence ``index`` (like megatron-core's ``get``)."""
        if not -self.num_sequences <= index < self.num_sequences:
            raise IndexError(f"sequence {index} out of range (0..{self.num_sequences - 1})")
        index %= self.num_sequences
        start = int(self.sequence_pointers[index]) // self.dtype.itemsize + offset
        size = int(self.sequence_lengths[index]) - offset if length is None else length
        return self.tokens[start : start + size]

    def document(self, index: int) -> np.ndarray:
        """The tokens of document ``index`` (its sequences back to back)."""
        if not 0 <= index < self.num_documents:
            raise IndexError(f"document {index} out of range (0..{self.num_documents - 1})")
        first, end = int(self.document_indices[index]), int(self.document_indices[index + 1])
        if first == end:
            return self.tokens[0:0]
        start = int(self.sequence_pointers[first]) // self.dtype.itemsize
        stop = int(self.sequence_pointers[end - 1]) // self.dtype.itemsize + int(
            self.sequence_lengths[end - 1]
        )
        return self.tokens[start:stop]

    def manifest(self) -> Manifest | None:
        """The manifest ``PREFIX.json`` written by ``baton data prepare``, or None."""
        return read_manifest(self.prefix)

    def check_tokenizer(self, tokenizer: TokenizerInfo) -> Manifest | None:
        """Raise :class:`DataError` if the data was prepared with another tokenizer.

        Data without a manifest (prepared by other tools) is not checked (returns None).
        """
        return check_tokenizer(self.prefix, tokenizer)

    def __repr__(self) -> str:
        return (
            f"PreparedDataset({self.prefix!r}: {self.num_documents} documents, "
            f"{self.num_tokens} {self.dtype.name} tokens)"
        )
