"""Export a MaxText checkpoint written by baton (scanned layers) as a Hugging Face Llama
directory.

The orbax checkpoint is read in one process as NumPy arrays (no model is built), its
``params`` collection mapped by :func:`baton.backends.maxtext.hf.maxtext_to_hf`; the
architecture is the model spec the run recorded (``--model-config`` or ``--init-from
HF_DIR``).

Example::

    from baton.backends.maxtext.export import export_hf

    export_hf("runs/maxtext_tiny/checkpoints/step_000050", "exports/maxtext-hf")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baton.backends.hf_io import run_tokenizer, write_model
from baton.backends.maxtext.checkpoint import params_path
from baton.backends.maxtext.hf import maxtext_to_hf
from baton.core.errors import ExportError
from baton.core.model.spec import exported_spec


def read_params(items: Path) -> dict[str, Any]:
    """The ``params`` collection of a MaxText orbax checkpoint (its ``items`` folder)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(str(items))
    tree = getattr(metadata, "item_metadata", None) or metadata
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(str(items), restore_args=restore_args)
    return state["params"]["params"]


def export_hf(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a baton MaxText checkpoint's weights as a Hugging Face Llama directory
    (``baton.backends.hf_io.write_model``: weights, configs with the run tokenizer's
    special-token ids, tokenizer files); returns ``out_dir``."""
    checkpoint = Path(checkpoint_dir)
    spec = exported_spec(checkpoint)
    try:
        hf = maxtext_to_hf(read_params(params_path(checkpoint)), spec)
    except KeyError as error:
        raise ExportError(
            f"{checkpoint}: no MaxText parameter {error.args[0]!r} (scanned llama2 layers "
            "are exported)"
        ) from None
    return write_model(out_dir, hf, spec.to_hf_config(), tokenizer=run_tokenizer(checkpoint))
