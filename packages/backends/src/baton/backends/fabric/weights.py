"""Weights in: start a model from a Hugging Face directory, a baton checkpoint or a file.

``load_weights(model, source)`` copies weights only (no optimizer, no step): the
fine-tuning start. Every tensor in the source must exist in the model with the same
shape; the first that does not is named with both shapes. Parameters the source lacks
are an error too, except those tied to one it has (a Hugging Face ``lm_head`` sharing
the embedding).

A Hugging Face directory loaded into a ``transformers`` model is read by that model's
class (``from_pretrained``), so the names and layouts ``transformers`` converts on load
(a Qwen3-MoE's per-expert tensors into its fused expert weights) arrive as the model
holds them; into any other model the safetensors are read as written.

Example::

    load_weights(model, "hf_models/tiny-llama")           # *.safetensors (+ index)
    load_weights(model, "runs/pretrain/checkpoints/step_000500")
    load_weights(model, "weights.safetensors")
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from baton.backends.hf_io import read_safetensors
from baton.core.checkpoints.files import BACKEND_DIR

#: where a checkpoint of a Hugging Face model keeps its config (``baton export`` reads it)
HF_CONFIG_DIR = "hf"
#: the state file of the Fabric backend inside a checkpoint's ``backend/``
STATE_FILE = "state.pt"


class WeightsError(ValueError):
    """The weights cannot start this model; the message names the tensor and the fix."""


def transformers_weights(model: nn.Module, source: str | Path) -> dict[str, torch.Tensor] | None:
    """The weights of the ``save_pretrained`` directory ``source`` as ``transformers``
    loads them into ``model``'s class, or ``None`` when ``model`` is no ``transformers``
    model or ``source`` no such directory."""
    path = Path(source)
    transformers = sys.modules.get("transformers")  # a transformers model imported it
    if (
        transformers is None
        or not isinstance(model, transformers.PreTrainedModel)
        or not (path / "config.json").is_file()
        or not any(path.glob("*.safetensors"))
    ):
        return None
    loaded = type(model).from_pretrained(path, dtype=torch.float32)
    return dict(loaded.state_dict())


def read_weights(source: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of ``source``: a directory of ``*.safetensors`` (a Hugging Face
    model), a baton checkpoint (``backend/state.pt``), or one ``.safetensors``/``.pt`` file."""
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        state_file = next(
            (p for p in (path / BACKEND_DIR / STATE_FILE, path / STATE_FILE) if p.is_file()), None
        )
        if files:
            return read_safetensors(path)
        if state_file is not None:
            return _model_of_state(torch.load(state_file, map_location="cpu", weights_only=True))
        raise WeightsError(
            f"init_from {str(path)!r} has no *.safetensors file and no baton checkpoint "
            "(backend/state.pt): give a Hugging Face model directory (save_pretrained), a "
            "checkpoint directory, or a weights file"
        )
    if path.suffix == ".safetensors" and path.is_file():
        return read_safetensors(path)
    if path.is_file():
        return _model_of_state(torch.load(path, map_location="cpu", weights_only=True))
    raise WeightsError(f"init_from {str(path)!r} does not exist")


def _model_of_state(state: dict) -> dict[str, torch.Tensor]:
    model = state.get("model", state)
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise WeightsError("the weights file holds no model state dict (name -> tensor)")
    return model


def _order_in(own: dict[str, torch.Tensor]) -> Any:
    position = {name: i for i, name in enumerate(own)}
    return lambda name: position.get(name, len(position))


def load_weights(model: nn.Module, source: str | Path) -> None:
    """Copy the weights of ``source`` into ``model`` (shapes must match exactly)."""
    state = transformers_weights(model, source)
    state = read_weights(source) if state is None else state
    own = model.state_dict()
    for name in sorted(state, key=_order_in(own)):  # the model's order: "first" is its first
        tensor = state[name]
        if name not in own:
            close = [k for k in own if k.endswith(name.split(".")[-1])][:3]
            raise WeightsError(
                f"init_from {source}: tensor {name!r} has no counterpart in the model "
                f"{type(model).__name__} (parameters named like it: {close}); the weights "
                "come from a different architecture"
            )
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise WeightsError(
                f"init_from {source}: parameter {name!r} has shape {tuple(tensor.shape)} in "
                f"the weights but {tuple(own[name].shape)} in the model; build the model "
                "with the configuration the weights were saved with"
            )
    loaded = {own[name].data_ptr() for name in state}
    missing = [n for n in own if n not in state and own[n].data_ptr() not in loaded]
    if missing:
        raise WeightsError(
            f"init_from {source}: the weights lack {len(missing)} of the model's tensors "
            f"(first: {missing[0]!r}); they come from a smaller or different model"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor.to(own[name].dtype))
