"""``baton export``: a checkpoint's weights in another format.

baton export CHECKPOINT --format hf OUT_DIR [--ema]

``--format hf`` writes a Hugging Face model directory (``model.safetensors`` +
``config.json``) that ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)``
loads, with the run's tokenizer files when it trained with a tokenizer directory. It
works for checkpoints of the ``fabric`` backend whose model is a
``transformers`` model: the backend saves the model's config beside its weights
(``backend/hf/config.json``); the weights are loaded into the architecture that config
names and saved with ``save_pretrained``. TorchTitan Llama checkpoints go through
TorchTitan's own state-dict adapter (``baton.backends.torchtitan.export``); Megatron-Core
checkpoints of a Llama spec (any tensor/pipeline layout) through baton's mapping
(``baton.backends.megatron.export``). Any other checkpoint is refused with the reason.
``--ema`` writes the ``EMA`` callback's averaged weights (``ema_export``).

Example::

    uv run baton run recipes/hf_finetune.py --init-from tiny-llama --max-steps 50
    uv run baton export runs/hf_finetune/checkpoints/latest --format hf exported/
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('exported')"
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baton.core.checkpointing import BACKEND_DIR, CheckpointError, read_meta
from baton.core.errors import ExportError
from baton.tools.ema_export import EMA_DIR, assemble, replace_weights

FORMATS = ("hf",)
#: the Fabric backend's files inside a checkpoint's ``backend/`` directory
STATE_FILE = "state.pt"
HF_CONFIG_DIR = "hf"


#: a run's tokenizer files copied beside the exported weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def export_hf(checkpoint: Path, out_dir: Path, *, ema: bool = False) -> Path:
    """Write the checkpoint's model as a Hugging Face directory (with the run's tokenizer
    files when it used a tokenizer directory); returns ``out_dir``. ``ema``: the ``EMA``
    callback's averaged weights instead of the trained ones (``ema_export``)."""
    meta = read_meta(checkpoint)
    averages = assemble(checkpoint / EMA_DIR) if ema else None
    out = _export_weights(checkpoint, out_dir, meta.get("backend", {}))
    if averages is not None:
        replace_weights(out, averages)
    tokenizer = meta.get("settings", {}).get("tokenizer")
    if isinstance(tokenizer, str) and Path(tokenizer).is_dir():
        for name in TOKENIZER_FILES:
            if (Path(tokenizer) / name).is_file():
                shutil.copyfile(Path(tokenizer) / name, out / name)
    return out


def _export_weights(checkpoint: Path, out_dir: Path, backend: dict[str, Any]) -> Path:
    name = backend.get("name")
    if name in ("torchtitan", "megatron", "maxtext"):  # TorchTitan's adapter; baton's maps
        module = importlib.import_module(f"baton.backends.{name}.export")
        return module.export_hf(checkpoint, out_dir)
    hf_config = checkpoint / BACKEND_DIR / HF_CONFIG_DIR
    if backend.get("name") != "fabric" or not (hf_config / "config.json").is_file():
        model = backend.get("model", "unknown")
        raise ExportError(
            f"checkpoint {checkpoint} has no Hugging Face mapping: it was written by the "
            f"{backend.get('name')!r} backend for model {model!r}, which is not a "
            "transformers model. --format hf exports checkpoints of transformers models "
            "trained with the fabric backend (recipes/hf_finetune.py)"
        )
    state_file = checkpoint / BACKEND_DIR / STATE_FILE
    if not state_file.is_file():
        raise ExportError(
            f"{state_file} is not a file: a sharded (FSDP) checkpoint must be consolidated "
            "first (lightning.fabric.utilities.consolidate_checkpoint)"
        )
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    weights = torch.load(state_file, map_location="cpu", weights_only=True)["model"]
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ExportError(
            f"the weights in {state_file} do not fit {type(model).__name__}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="baton export", description="Write a checkpoint's weights in another format."
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (step_NNNNNN)")
    parser.add_argument("out_dir", type=Path, help="where to write the exported model")
    parser.add_argument("--format", choices=FORMATS, required=True, help="hf: Hugging Face")
    parser.add_argument(
        "--ema", action="store_true", help="the EMA callback's averaged weights (CKPT/ema/)"
    )
    args = parser.parse_args(list(argv))
    try:
        out = export_hf(args.checkpoint.resolve(), args.out_dir, ema=args.ema)
    except (ExportError, CheckpointError) as error:
        print(f"baton export: {error}", file=sys.stderr)
        return 2
    weights = "EMA weights" if args.ema else "weights"
    print(f"exported the {weights} of {args.checkpoint} to {out} (Hugging Face format)")
    return 0
