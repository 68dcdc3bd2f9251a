"""Named arrays shaped like a torch run's pieces, saved beside a checkpoint and read back.

``save`` writes this rank's counted pieces into ``arrays-rank<r>.safetensors`` (a
callback's state too large for ``baton.json``, e.g. averaged weights); the file's
metadata records each array's global shape and the slice it is, so a tool can assemble
whole tensors from every rank's file. ``load`` finds, for each piece this run holds
(replicas included), the array with the same name, global shape and slice in any
rank's file; a different layout is refused, naming both::

    save(run_dir / "ema", {"model.norm.weight": averaged}, state.parameters(), rank=0)
    arrays = load(run_dir / "ema", state.parameters())     # {"model.norm.weight": tensor}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from baton.core.model_state import Piece

#: the file pattern, one per rank
FILE = "arrays-rank{rank}.safetensors"


def _where(piece: Piece) -> dict[str, Any]:
    return {
        "global_shape": list(piece.global_shape),
        "index": [[s.start, s.stop] for s in piece.index],
    }


def save(directory: Path, arrays: Mapping[str, Any], pieces: Sequence[Piece], *, rank: int) -> None:
    """Write the counted pieces' arrays of this rank (names not among the pieces are
    refused); a rank holding none writes an empty file."""
    by_name = {piece.name: piece for piece in pieces}
    unknown = sorted(set(arrays) - set(by_name))
    if unknown:
        raise KeyError(f"save_arrays: no parameters named {unknown}")
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    for name, array in arrays.items():
        piece = by_name[name]
        if not piece.counted:
            continue
        tensors[name] = array.detach().contiguous().cpu()
        layout[name] = _where(piece)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        tensors,
        str(directory / FILE.format(rank=rank)),
        metadata={"baton.layout": json.dumps(layout)},
    )


def load(directory: Path, pieces: Sequence[Piece]) -> dict[str, Any]:
    """The saved arrays of the names this run holds, each on its piece's device."""
    from safetensors import safe_open

    files = sorted(directory.glob(FILE.format(rank="*")))
    if not files:
        raise FileNotFoundError(f"load_arrays: no {FILE.format(rank='*')} in {directory}")
    saved: dict[str, list[tuple[dict[str, Any], Path]]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            layout = json.loads((handle.metadata() or {}).get("baton.layout", "{}"))
        for name, where in layout.items():
            saved.setdefault(name, []).append((where, path))
    wanted: dict[Path, list[Piece]] = {}
    for piece in pieces:
        if piece.name not in saved:
            continue
        here = _where(piece)
        source = next((path for where, path in saved[piece.name] if where == here), None)
        if source is None:
            theirs = [where for where, _ in saved[piece.name]]
            raise ValueError(
                f"load_arrays: {piece.name} was saved in another layout: {theirs}; this "
                f"run holds {here}. Resume with the layout it was saved with."
            )
        wanted.setdefault(source, []).append(piece)
    out: dict[str, Any] = {}
    for path, held in wanted.items():
        with safe_open(str(path), framework="pt") as handle:
            for piece in held:
                out[piece.name] = handle.get_tensor(piece.name).to(piece.value.device)
    return out
