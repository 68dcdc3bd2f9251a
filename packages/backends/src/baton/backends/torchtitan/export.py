"""Export a TorchTitan checkpoint written by baton as a Hugging Face model directory.

The weights go through TorchTitan's own state-dict adapter for the model
(``Llama3StateDictAdapter.to_hf`` for llama3: Hugging Face names, the rotary
permutation of the query and key projections; ``Qwen3StateDictAdapter.to_hf`` for a
Qwen3 built from a recorded spec, whose ``config.json`` is that spec's); the directory (``model.safetensors``, a
``config.json`` written from the model's :class:`LlamaSpec` that ``transformers`` reads as
``LlamaForCausalLM``, the run tokenizer's ids and files) is written by
``baton.backends.hf_io``. Nothing is sharded
or gathered by hand: DCP reads the full tensors from the checkpoint in one process.

Example::

    from baton.backends.torchtitan.export import export_hf

    export_hf("runs/titan/checkpoints/step_000020", "exports/titan-hf")
    # transformers.AutoModelForCausalLM.from_pretrained("exports/titan-hf")

``checkpoint_dir`` may be a baton checkpoint (``step_NNNNNN``), its ``backend`` folder, or
a TorchTitan DCP folder (``step-N``); the model (``llama3/debugmodel``) is read from the
checkpoint's ``baton.json`` unless ``model`` names it.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from baton.backends.hf_io import run_tokenizer, write_model
from baton.backends.torchtitan.hf import FLAVOR_PREFIX, register
from baton.core.checkpoints.files import BACKEND_DIR
from baton.core.errors import ExportError
from baton.core.model.spec import LlamaSpec, RopeScaling, recorded_spec

#: DCP keys of a TorchTitan checkpoint that are not model weights
NON_MODEL_KEYS = ("optimizer", "lr_scheduler", "dataloader", "train_state")
#: TorchTitan models this module exports (to ``LlamaForCausalLM``; a qwen3 built from a
#: recorded spec to ``Qwen3ForCausalLM``)
ARCHITECTURES = ("llama3", "qwen3")


def dcp_folder(checkpoint_dir: str | Path) -> Path:
    """The TorchTitan DCP folder (the one holding ``.metadata``) inside ``checkpoint_dir``."""
    path = Path(checkpoint_dir)
    backend = path / BACKEND_DIR
    for candidate in (path, backend, *sorted(path.glob("step-*")),
                      *sorted(backend.glob("step-*"))):  # fmt: skip
        if (candidate / ".metadata").is_file():
            return candidate
    raise ExportError(
        f"{path} holds no TorchTitan checkpoint (no .metadata in it, its backend/ or a "
        "step-N folder); pass a baton checkpoint directory such as runs/NAME/checkpoints/"
        "step_000100 (to start a run from Hugging Face weights: --init-from a Hugging Face "
        "model directory, config.json and weights)"
    )


def checkpoint_model(checkpoint_dir: str | Path) -> str:
    """``name/flavor`` of the model a baton checkpoint was saved from (its ``baton.json``)."""
    path = Path(checkpoint_dir)
    for meta in (
        path / "baton.json",
        path.parent / "baton.json",
        path.parent.parent / "baton.json",
    ):
        if meta.is_file():
            backend = json.loads(meta.read_text()).get("backend", {})
            if backend.get("name") != "torchtitan":
                raise ExportError(
                    f"{meta} was written by the {backend.get('name')!r} backend, not torchtitan"
                )
            return str(backend["model"])
    raise ExportError(
        f"no baton.json next to {path}: pass model='llama3/debugmodel' (name/flavor) to export_hf"
    )


def read_model_weights(folder: Path) -> dict[str, Any]:
    """The model's full tensors from a DCP checkpoint, by TorchTitan FQN, in this process."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    weights = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata) and not key.startswith(NON_MODEL_KEYS)
    }
    if not weights:
        raise ExportError(f"{folder}: the checkpoint holds no model weights")
    dcp.load(weights, checkpoint_id=str(folder), no_dist=True)
    return weights


def to_hf_weights(adapter: Any, weights: dict[str, Any], *, where: str) -> dict[str, Any]:
    """TorchTitan's model weights (full tensors by TorchTitan FQN, as its checkpoints hold
    them) by Hugging Face name, through the model's state-dict adapter (``to_hf``: the
    names, the rotary permutation of the query and key projections). A mixture of experts
    balanced by an expert bias has no Hugging Face form: ``ExportError`` naming ``where``
    the weights come from."""
    from baton.backends.torchtitan.moe import expert_bias_refusal

    refusal = expert_bias_refusal(weights)
    if refusal is not None:
        raise ExportError(f"{where}: {refusal}")
    return adapter.to_hf(weights)


def titan_spec(model_config: Any, hf_weights: dict[str, Any]) -> LlamaSpec:
    """The Llama spec of a TorchTitan llama3 model (a registry flavour such as
    ``debugmodel``): shapes from the exported tensors, the rest (heads, normalization
    epsilon, rotary settings) from TorchTitan's model config."""
    attention = model_config.layers[0].attention
    rope = attention.rope
    layers = {int(key.split(".")[2]) for key in hf_weights if key.startswith("model.layers.")}
    vocab, hidden = hf_weights["model.embed_tokens.weight"].shape
    n_heads = attention.n_heads
    scaling = None
    if rope.scaling == "llama":
        scaling = RopeScaling(
            factor=float(rope.scaling_factor),
            low_freq_factor=float(rope.low_freq_factor),
            high_freq_factor=float(rope.high_freq_factor),
            original_max_position_embeddings=int(rope.original_max_position_embeddings),
        )
    elif rope.scaling not in (None, "none"):
        raise ExportError(f"rotary scaling {rope.scaling!r} has no Hugging Face Llama mapping")
    return LlamaSpec(
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        num_layers=len(layers),
        num_heads=n_heads,
        num_kv_heads=attention.n_kv_heads or n_heads,
        ffn_hidden_size=int(hf_weights["model.layers.0.mlp.gate_proj.weight"].shape[0]),
        head_dim=attention.head_dim or int(hidden) // n_heads,
        rope_theta=float(rope.theta),
        norm_eps=model_config.norm.eps,
        tie_embeddings=bool(getattr(model_config, "enable_weight_tying", False)),
        max_seq_len=rope.max_seq_len,
        rope_scaling=scaling,
    )


def export_hf(checkpoint_dir: str | Path, out_dir: str | Path, *, model: str | None = None) -> Path:
    """Write the checkpoint's weights as a Hugging Face model directory; returns ``out_dir``.

    ``model`` is ``name/flavor`` of TorchTitan's model registry (read from the
    checkpoint's ``baton.json`` when omitted). Raises :class:`ExportError` for a folder
    without a TorchTitan checkpoint or a model with no Hugging Face mapping.
    """
    folder = dcp_folder(checkpoint_dir)
    name, _, flavor = (model or checkpoint_model(checkpoint_dir)).partition("/")
    if name not in ARCHITECTURES:
        raise ExportError(
            f"TorchTitan model {name!r} has no Hugging Face export here; exportable: "
            f"{sorted(ARCHITECTURES)}"
        )
    recorded = recorded_spec(checkpoint_dir)
    if flavor.startswith(FLAVOR_PREFIX):  # a --model-config spec: register it again
        if recorded is None:
            raise ExportError(f"{checkpoint_dir}: model {flavor!r} but no recorded model_spec")
        flavor = register(LlamaSpec.from_dict(recorded))
    elif name == "qwen3":
        raise ExportError(
            f"TorchTitan's qwen3/{flavor} exports only when built from a Hugging Face "
            "config (--model-config or --init-from HF_DIR), whose spec names its config.json"
        )
    spec = importlib.import_module(f"torchtitan.models.{name}").model_registry(flavor)
    adapter = spec.state_dict_adapter(spec.model, None)
    hf_weights = to_hf_weights(adapter, read_model_weights(folder), where=str(checkpoint_dir))
    dtype = str(hf_weights["model.embed_tokens.weight"].dtype).removeprefix("torch.")
    if name == "qwen3":  # the recorded spec (built from it), with the trained vocabulary
        vocab = int(hf_weights["model.embed_tokens.weight"].shape[0])
        config = LlamaSpec.from_dict(recorded or {}).with_vocab(vocab).to_hf_config(dtype=dtype)
    else:
        config = titan_spec(spec.model, hf_weights).to_hf_config(dtype=dtype)
    return write_model(out_dir, hf_weights, config, tokenizer=run_tokenizer(checkpoint_dir))
