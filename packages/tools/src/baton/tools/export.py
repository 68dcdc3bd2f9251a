"""``baton export``: a checkpoint's weights in another format.

baton export CHECKPOINT --format hf OUT_DIR [--ema]

``--format hf`` writes a Hugging Face model directory that
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads: ``model.safetensors``,
``config.json`` and ``generation_config.json`` carrying the run tokenizer's special-token
ids (generation stops at its end of document), and the tokenizer's files. Each backend
that declares an exporter (``BackendDescriptor.exporter``) maps its weights
(``baton.backends.<name>.export``): Fabric's ``transformers`` models as they are,
TorchTitan's through its own state-dict adapter, Megatron-Core's (any tensor/pipeline
layout) and MaxText's through baton's mappings of a Llama spec; ``baton.backends.hf_io``
writes the directory. Any other checkpoint is refused with the reason.
``--ema`` writes the ``EMA`` callback's averaged weights over them (``ema_export``).

Example::

    uv run baton run recipes/hf_finetune.py --init-from tiny-llama --max-steps 50
    uv run baton export runs/hf_finetune/checkpoints/latest --format hf exported/
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('exported')"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from baton.core.backend_descriptor import BackendDescriptor, backend_descriptors
from baton.core.checkpoints.files import CheckpointError, read_meta
from baton.core.errors import ExportError, UsageError
from baton.core.quiet import quiet_imports
from baton.tools.ema_export import EMA_DIR, assemble, replace_weights

FORMATS = ("hf",)


def exporters() -> dict[str, BackendDescriptor]:
    """The backends whose checkpoints export to Hugging Face format (each declares its
    exporter), in the order backends are listed."""
    return {d.name: d for d in backend_descriptors() if d.exports_hf}


def export_hf(checkpoint: Path, out_dir: Path, *, ema: bool = False) -> Path:
    """Write the checkpoint's model as a Hugging Face directory; returns ``out_dir``.
    ``ema``: the ``EMA`` callback's averaged weights instead of the trained ones."""
    backend = read_meta(checkpoint).get("backend", {})
    name = backend.get("name")
    known = exporters()
    if name not in known:
        raise ExportError(
            f"checkpoint {checkpoint} has no Hugging Face mapping: it was written by the "
            f"{name!r} backend for model {backend.get('model', 'unknown')!r}; --format hf "
            f"exports checkpoints of {', '.join(known)}"
        )
    averages = assemble(checkpoint / EMA_DIR) if ema else None  # refused early if absent
    out = known[name].load_exporter()(checkpoint, out_dir)
    if averages is not None:
        replace_weights(out, averages)
    return out


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
    quiet_imports()  # the backends' known-harmless notes (reading a checkpoint in one process)
    try:
        out = export_hf(args.checkpoint.resolve(), args.out_dir, ema=args.ema)
    except (UsageError, CheckpointError) as error:
        print(f"baton export: {error}", file=sys.stderr)
        return 2
    weights = "EMA weights" if args.ema else "weights"
    print(f"exported the {weights} of {args.checkpoint} to {out} (Hugging Face format)")
    return 0
