"""Export a Megatron-Core checkpoint written by baton as a Hugging Face Llama, Qwen3 or
Qwen3-MoE directory.

A ``dist_checkpointing`` save (``torch_dist``) stores each weight as one global tensor,
whatever tensor- or pipeline-parallel layout wrote it (the layers stacked along a first
dimension, the fused QKV by query group, ``linear_fc1`` as gate over up). This module
reads those global tensors in one process with ``torch.distributed.checkpoint`` (no
model is built, no process group), unstacks the layers and maps them with
:func:`baton.backends.megatron.hf.megatron_to_hf`. The architecture is the model spec
the run recorded (``--model-config`` or ``--init-from HF_DIR``).

Example::

    from baton.backends.megatron.export import export_hf

    export_hf("runs/megatron_gpt_tiny/checkpoints/step_000050", "exports/megatron-hf")
    # transformers.LlamaForCausalLM.from_pretrained("exports/megatron-hf")
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from baton.backends.hf_io import run_tokenizer, write_model
from baton.backends.megatron.hf import TE_NORMS, megatron_to_hf
from baton.backends.megatron.moe import split_experts
from baton.core.checkpoints.files import native_dir
from baton.core.errors import ExportError
from baton.core.model.spec import exported_spec

#: keys of a baton Megatron checkpoint that are not model weights
NON_MODEL = ("optimizer.", "rng_state", "common_state")


def read_global_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The model's global tensors of a ``torch_dist`` checkpoint, by Megatron's sharded
    key (layers stacked: ``decoder.layers.self_attention.linear_qkv.weight`` is
    ``[num_layers, ...]``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (folder / ".metadata").is_file():
        raise ExportError(
            f"{folder} holds no Megatron torch_dist checkpoint (no .metadata); pass a baton "
            "checkpoint directory such as runs/NAME/checkpoints/step_000100"
        )
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    weights = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata) and not key.startswith(NON_MODEL)
    }
    dcp.load(weights, checkpoint_id=str(folder), no_dist=True)
    return weights


def unstack_layers(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``decoder.layers.X`` of shape ``[L, ...]`` (or already per layer,
    ``decoder.layers.N.X``, as Megatron saves a model with MoE layers) ->
    ``decoder.layers.{i}.X`` (local-spec names: Transformer Engine's fused layer norms
    become the separate norms; the experts one tensor each, ``moe.split_experts``)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in weights.items():
        if not key.startswith("decoder.layers."):
            out[key] = tensor
            continue
        rest = key.removeprefix("decoder.layers.")
        numbered = re.fullmatch(r"(\d+)\.(.*)", rest)
        if numbered is not None:
            rest, layers = numbered.group(2), [(int(numbered.group(1)), tensor)]
        else:
            layers = list(enumerate(tensor.unbind(0)))
        rest = TE_NORMS.get(rest, rest)
        for index, layer in layers:
            out.update(split_experts(f"decoder.layers.{index}.{rest}", layer))
    return out


def export_hf(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a baton Megatron checkpoint's weights as a Hugging Face Llama directory
    (``baton.backends.hf_io.write_model``: weights, configs with the run tokenizer's
    special-token ids, tokenizer files); returns ``out_dir``."""
    checkpoint = Path(checkpoint_dir)
    spec = exported_spec(checkpoint)
    folder = native_dir(checkpoint)
    weights = unstack_layers(read_global_weights(folder))
    try:
        hf = megatron_to_hf(weights, spec)
    except KeyError as error:
        raise ExportError(f"{checkpoint}: no Megatron weight {error.args[0]!r}") from None
    config = spec.to_hf_config(dtype=str(hf["model.embed_tokens.weight"].dtype).split(".")[-1])
    return write_model(out_dir, hf, config, tokenizer=run_tokenizer(checkpoint))
