"""The files ``ModelState.save_arrays`` writes: named pieces with their layout.

One safetensors file per rank (``arrays-rank<r>.safetensors``) holds that rank's
counted pieces under their parameter names; the file's metadata (``baton.layout``)
records each piece's global shape and where it sits in the whole tensor, so a tool
assembles whole tensors from every rank's file without knowing how the run was laid out
(``baton export --ema``)::

    metadata = layout_metadata(pieces)            # a backend's save_arrays
    safetensors.numpy.save_file(arrays, directory / array_file(rank), metadata)

    for path in array_files(directory):           # a tool reading them back
        with safetensors.safe_open(path, "pt") as f:
            for name, (shape, index) in read_layout(f.metadata()).items(): ...

Pure Python: backends and tools bring their own array library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from baton.core.model_state import Piece

#: the metadata key of the layout record
LAYOUT_KEY = "baton.layout"

_FILE = re.compile(r"arrays-rank(\d+)\.safetensors")

#: one piece's place: the whole tensor's shape and the slice this piece covers
Placement = tuple[tuple[int, ...], tuple[slice, ...]]


def array_file(rank: int) -> str:
    """The file name of rank ``rank``'s arrays (``arrays-rank0.safetensors``)."""
    return f"arrays-rank{rank}.safetensors"


def array_files(directory: Path) -> list[Path]:
    """Every rank's arrays file in ``directory``, by rank."""
    found: list[tuple[int, Path]] = []
    for path in directory.glob("arrays-rank*.safetensors"):
        if match := _FILE.fullmatch(path.name):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def layout_metadata(pieces: Iterable[Piece]) -> dict[str, str]:
    """The safetensors metadata recording where each piece sits in its whole tensor."""
    layout = {
        piece.name: {"global_shape": list(piece.global_shape), "index": _bounds(piece)}
        for piece in pieces
    }
    return {LAYOUT_KEY: json.dumps(layout)}


def _bounds(piece: Piece) -> list[list[int]]:
    return [
        [s.start or 0, extent if s.stop is None else s.stop]
        for s, extent in zip(piece.index, piece.global_shape, strict=True)
    ]


def read_layout(metadata: Mapping[str, str] | None) -> dict[str, Placement]:
    """``{name: (global_shape, index)}`` from a file's metadata (``layout_metadata``)."""
    if not metadata or LAYOUT_KEY not in metadata:
        raise ValueError(
            f"the arrays file has no {LAYOUT_KEY!r} metadata: it was not written by "
            "ModelState.save_arrays"
        )
    layout = json.loads(metadata[LAYOUT_KEY])
    return {
        name: (
            tuple(int(n) for n in entry["global_shape"]),
            tuple(slice(int(a), int(b)) for a, b in entry["index"]),
        )
        for name, entry in layout.items()
    }
