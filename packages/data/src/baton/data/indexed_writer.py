"""Write Megatron's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``) with numpy alone.

The bytes are those of megatron-core's ``IndexedDatasetBuilder`` for the same calls (a
test writes both and compares them), without importing torch and Megatron-Core, which
takes seconds: ``baton data prepare`` starts writing at once.

Example::

    import numpy as np
    from baton.data.indexed_writer import IndexedWriter

    writer = IndexedWriter("data/c.bin", np.uint16)
    writer.add_document(np.array([5, 6, 7, 0, 8, 0]), [4, 2])   # one document, two sequences
    writer.add_document([9, 9, 0], [3])
    writer.close()
    writer.finalize("data/c.idx")           # layout: see :mod:`baton.data.indexed`
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from baton.data.errors import DataError
from baton.data.indexed import DTYPE_CODES, INDEX_HEADER


class IndexedWriter:
    """Appends documents to ``bin_path``; :meth:`finalize` writes the index.

    ``add_document(tokens, lengths)`` writes one document made of ``len(lengths)``
    sequences (megatron-core's ``add_document``). Call :meth:`close` before
    :meth:`finalize`, or use it as a context manager.
    """

    def __init__(self, bin_path: str | Path, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        codes = {np.dtype(kind): code for code, kind in DTYPE_CODES.items()}
        if self.dtype not in codes:
            raise DataError(f"token dtype {self.dtype} is not one Megatron's index knows")
        self._code = codes[self.dtype]
        self._file = open(bin_path, "wb")
        self.sequence_lengths: list[int] = []
        #: sequence index where each document starts, then the sequence count
        self.document_indices: list[int] = [0]

    def add_document(self, tokens: Any, lengths: Sequence[int]) -> None:
        array = np.asarray(tokens).astype(self.dtype, copy=False)
        self._file.write(array.tobytes(order="C"))
        self.sequence_lengths.extend(int(length) for length in lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finalize(self, idx_path: str | Path) -> None:
        """Write the index of everything added to ``idx_path``."""
        self.close()
        lengths = np.array(self.sequence_lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(idx_path, "wb") as index:
            index.write(INDEX_HEADER)
            index.write(struct.pack("<Q", 1))
            index.write(struct.pack("<B", self._code))
            index.write(struct.pack("<Q", len(lengths)))
            index.write(struct.pack("<Q", len(self.document_indices)))
            index.write(lengths.tobytes(order="C"))
            index.write(pointers.tobytes(order="C"))
            index.write(np.array(self.document_indices, dtype=np.int64).tobytes(order="C"))
