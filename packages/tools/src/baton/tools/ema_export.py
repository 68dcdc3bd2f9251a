"""``baton export CKPT --format hf OUT --ema``: the EMA callback's averaged weights in
place of the trained ones.

The checkpoint is exported as usual (config, tokenizer, the trained weights); then the
averages the ``EMA`` callback saved in ``CKPT/ema/`` (one safetensors file per rank, each
piece with its place in the whole tensor: ``baton.core.checkpoints.array_files``) are assembled into
whole tensors and written over the weights of the same names::

    averages = assemble(checkpoint / "ema")        # {"model.layers.0.mlp.up_proj.weight": tensor}
    replace_weights(out_dir, averages)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from baton.callbacks.ema import EMA_DIR
from baton.core.checkpoints.array_files import array_files, read_layout
from baton.core.errors import ExportError

__all__ = ["EMA_DIR", "assemble", "replace_weights"]


def assemble(directory: Path) -> dict[str, Any]:
    """Whole tensors from every rank's pieces in ``directory``; a tensor whose pieces do
    not cover it is refused."""
    import torch
    from safetensors import safe_open

    files = array_files(directory)
    if not files:
        raise ExportError(
            f"{directory} holds no averaged weights (arrays-rank*.safetensors): the run had "
            "no EMA callback, or saved before its first update; export without --ema"
        )
    whole: dict[str, torch.Tensor] = {}
    covered: dict[str, int] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name, (shape, index) in read_layout(handle.metadata()).items():
                piece = handle.get_tensor(name)
                if name not in whole:
                    whole[name] = torch.zeros(shape, dtype=piece.dtype)
                    covered[name] = 0
                whole[name][index] = piece
                covered[name] += piece.numel()
    partial = [name for name, tensor in whole.items() if covered[name] != tensor.numel()]
    if partial:
        raise ExportError(f"{directory}: the saved pieces do not cover {partial[:3]}")
    return whole


def fit_to(name: str, tensor: Any, shape: tuple[int, ...]) -> Any:
    """``tensor`` in the exported ``shape``: as it is; reshaped row-major when only the
    grouping differs (Megatron-Core's q/k/v parts, shaped per key/value group); its
    leading rows when the run padded the vocabulary (Megatron-Core's embedding and
    output layer)."""
    have = tuple(tensor.shape)
    if have == shape:
        return tensor
    if tensor.numel() == _count(shape):
        return tensor.reshape(shape)
    if len(have) == len(shape) and have[1:] == shape[1:] and have[0] >= shape[0]:
        return tensor[: shape[0]]
    raise ExportError(f"the averaged {name} has shape {have}; the exported model has {shape}")


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for extent in shape:
        total *= extent
    return total


def replace_weights(out_dir: Path, tensors: Mapping[str, Any]) -> None:
    """Write ``tensors`` over the weights of the same names in the exported
    ``*.safetensors`` files of ``out_dir`` (each cast to the exported dtype)."""
    from safetensors.torch import load_file, save_file

    placed: set[str] = set()
    for path in sorted(out_dir.glob("*.safetensors")):
        weights = load_file(str(path))
        mine = [name for name in weights if name in tensors]
        for name in mine:
            fitted = fit_to(name, tensors[name], tuple(weights[name].shape))
            weights[name] = fitted.to(weights[name].dtype).contiguous()
        if mine:
            save_file(weights, str(path), metadata={"format": "pt"})
            placed.update(mine)
    missing = sorted(set(tensors) - placed)
    if missing:
        raise ExportError(
            f"the averaged weights {missing[:3]} have no counterpart in the exported model "
            "(the EMA names are the model_state names: Hugging Face names for a model-spec run)"
        )
