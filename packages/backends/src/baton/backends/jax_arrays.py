"""Named JAX arrays beside a checkpoint (``ModelState.save_arrays``/``load_arrays``) for
every JAX backend: global arrays, so process 0 writes each whole into one file
(``arrays-rank0.safetensors``, with the layout record ``baton.core.checkpoints.array_files``
describes) and every process reads it back, placing each array like its parameter.

Example::

    pieces = {p.name: p for p in model_state.parameters()}
    save_whole_arrays(directory, {"w": ema_of_w}, pieces)   # process 0 writes
    arrays = load_whole_arrays(directory, pieces)           # {"w": jax.Array}, placed
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from baton.core.checkpoints.array_files import array_file, layout_metadata, read_layout
from baton.core.model_state import Piece


def save_whole_arrays(
    directory: Path, arrays: Mapping[str, Any], pieces: Mapping[str, Piece]
) -> None:
    """On process 0, ``arrays`` (named like ``pieces``, the parameters) into
    ``directory/arrays-rank0.safetensors``; other processes write nothing."""
    import jax
    import numpy as np
    from safetensors.numpy import save_file

    if jax.process_index() != 0:
        return  # global arrays: process 0 writes them whole
    unknown = sorted(set(arrays) - pieces.keys())
    if unknown:
        raise KeyError(f"save_arrays: no parameters named {', '.join(unknown[:3])}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    host = {name: np.ascontiguousarray(jax.device_get(v)) for name, v in arrays.items()}
    metadata = layout_metadata(pieces[name] for name in host)
    save_file(host, str(directory / array_file(0)), metadata=metadata)


def load_whole_arrays(directory: Path, pieces: Mapping[str, Piece]) -> dict[str, Any]:
    """What ``save_whole_arrays`` wrote, each array placed like its piece's value
    (every process reads the whole file); a name or shape this run lacks is refused."""
    import jax
    from safetensors import safe_open

    path = Path(directory) / array_file(0)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: nothing was saved with save_arrays there")
    arrays: dict[str, Any] = {}
    with safe_open(str(path), framework="numpy") as saved:
        for name, (shape, _) in read_layout(saved.metadata()).items():
            piece = pieces.get(name)
            if piece is None or piece.global_shape != shape:
                mine = None if piece is None else piece.global_shape
                raise ValueError(
                    f"{path}: {name} was saved with shape {shape}; this run has {mine}"
                )
            arrays[name] = jax.device_put(saved.get_tensor(name), piece.value.sharding)
    return arrays
