"""Named arrays shaped like a model state's pieces, saved beside a checkpoint and read
back (``ModelState.save_arrays`` / ``load_arrays`` for torch pieces).

Each rank writes ``arrays-rank<r>.safetensors`` with its counted pieces' arrays and, in
the file's metadata, each one's global shape and index; loading reads every rank's file
and takes, for each of this run's pieces, the array saved under the same name and index
(a data-parallel replica reads its counted holder's). A piece whose name was saved at
other indices only (another layout) is refused naming what was saved and what is asked.

Example::

    save_arrays(directory, {"model.norm.weight": ema}, state.parameters())
    arrays = load_arrays(directory, state.parameters())
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from baton.core.model_state import Piece

_LAYOUT = "baton.layout"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _where(piece: Piece) -> dict[str, Any]:
    return {
        "global_shape": list(piece.global_shape),
        "index": [[part.start, part.stop] for part in piece.index],
    }


def save_arrays(directory: Path, arrays: Mapping[str, Any], pieces: Sequence[Piece]) -> None:
    """Write this rank's counted pieces of ``arrays`` (by name) with their layout."""
    from safetensors.torch import save_file

    counted = {piece.name: piece for piece in pieces if piece.counted and piece.name in arrays}
    tensors = {name: arrays[name].detach().contiguous().cpu() for name in counted}
    layout = {name: _where(piece) for name, piece in counted.items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        tensors,
        str(directory / f"arrays-rank{_rank()}.safetensors"),
        metadata={_LAYOUT: json.dumps(layout)},
    )


def load_arrays(directory: Path, pieces: Sequence[Piece]) -> dict[str, Any]:
    """The saved arrays for ``pieces`` (same names and indices), on the pieces' devices."""
    from safetensors import safe_open

    saved: dict[tuple[str, str], tuple[Path, str]] = {}
    for file in sorted(directory.glob("arrays-rank*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            layout = json.loads((handle.metadata() or {}).get(_LAYOUT, "{}"))
        for name, where in layout.items():
            saved[(name, json.dumps(where))] = (file, name)
    names = {name for name, _ in saved}
    out: dict[str, Any] = {}
    for piece in pieces:
        key = (piece.name, json.dumps(_where(piece)))
        if piece.name not in names:
            continue  # not saved (the arrays covered other names)
        if key not in saved:
            held = sorted({json.dumps([name, json.loads(where)]) for name, where in saved})
            raise ValueError(
                f"{directory} has no array for {piece.name} at {_where(piece)} (this run's "
                f"layout); it holds {held[:4]}{' ...' if len(held) > 4 else ''}: load it "
                "under the layout that saved it"
            )
        file, name = saved[key]
        with safe_open(str(file), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        out[piece.name] = tensor.to(piece.value.device)
    return out
