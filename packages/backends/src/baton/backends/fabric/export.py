"""Export a Fabric checkpoint of a ``transformers`` model as a Hugging Face directory.

The Fabric backend saves a ``transformers`` model's config beside its weights
(``backend/hf/config.json``); the weights (``backend/state.pt``) already carry Hugging
Face's names, so the only mapping is a check that they fit the architecture that config
names (built on the meta device, nothing allocated) and dropping the tensors tied to
others (``lm_head`` sharing the embedding). Weights ``transformers`` converts on load are
written back in the layout ``save_pretrained`` writes (a Qwen3-MoE's fused expert weights
as one tensor per expert). ``baton.backends.hf_io`` writes the directory
with the run tokenizer's special-token ids.

Example::

    from baton.backends.fabric.export import export_hf

    export_hf("runs/hf_finetune/checkpoints/step_000050", "exports/fabric-hf")
    # transformers.AutoModelForCausalLM.from_pretrained("exports/fabric-hf")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from baton.backends.fabric.weights import HF_CONFIG_DIR, STATE_FILE
from baton.backends.hf_io import run_tokenizer, write_model
from baton.core.checkpoints.files import BACKEND_DIR
from baton.core.errors import ExportError


def export_hf(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a baton Fabric checkpoint of a ``transformers`` model as a Hugging Face
    directory; returns ``out_dir``."""
    checkpoint = Path(checkpoint_dir)
    hf_config = checkpoint / BACKEND_DIR / HF_CONFIG_DIR / "config.json"
    if not hf_config.is_file():
        raise ExportError(
            f"checkpoint {checkpoint} has no Hugging Face mapping: its model is not a "
            f"transformers model (no {hf_config}). --format hf exports the fabric backend's "
            "checkpoints of transformers models (recipes/hf_finetune.py)"
        )
    state_file = checkpoint / BACKEND_DIR / STATE_FILE
    if not state_file.is_file():
        raise ExportError(
            f"{state_file} is not a file: a sharded (FSDP) checkpoint must be consolidated "
            "first (lightning.fabric.utilities.consolidate_checkpoint)"
        )
    import torch

    config: dict[str, Any] = json.loads(hf_config.read_text())
    weights = torch.load(state_file, map_location="cpu", weights_only=True)["model"]
    model = _check_fit(hf_config.parent, weights, state_file)
    tied = tied_names(model)
    own = {name: tensor for name, tensor in weights.items() if name not in tied}
    return write_model(
        out_dir, saved_layout(model, own), config, tokenizer=run_tokenizer(checkpoint)
    )


def saved_layout(model: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` (by ``model``'s parameter names) in the layout ``save_pretrained``
    writes for ``model``: ``transformers``' load-time conversions reverted."""
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, dict(weights)))


def tied_names(model: Any) -> set[str]:
    """The names of ``model``'s weights tied to another (not written)."""
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    return tied if getattr(model.config, "tie_word_embeddings", False) else set()


def _check_fit(config_dir: Path, weights: dict[str, Any], state_file: Path) -> Any:
    """Raise ``ExportError`` unless ``weights`` fit the model ``config_dir`` describes;
    returns that model, built on the meta device."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    tied = tied_names(model)
    expected = set(model.state_dict())
    missing = [name for name in expected - set(weights) if name not in tied]
    unexpected = sorted(set(weights) - expected)
    if missing or unexpected:
        raise ExportError(
            f"the weights in {state_file} do not fit {type(model).__name__}: "
            f"missing {sorted(missing)[:3]}, unexpected {unexpected[:3]}"
        )
    return model
