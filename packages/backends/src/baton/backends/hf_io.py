"""Hugging Face model directories in and out, for every backend.

A backend keeps only its weight mapping (its names and layouts to Hugging Face's and
back); reading and writing the directory is here, once: the weights as safetensors, a
``config.json`` and a ``generation_config.json`` that carry the run tokenizer's
special-token ids (so text generated from an export stops where the training data's
documents end), and the tokenizer files beside them.

Example::

    from baton.backends.hf_io import read_safetensors, run_tokenizer, write_model

    weights = read_safetensors("tiny-llama/")               # torch tensors by HF name
    arrays = read_safetensors("tiny-llama/", framework="numpy")
    write_model("exported/", hf_weights, spec.to_hf_config(), tokenizer=run_tokenizer(ckpt))
    # transformers.AutoModelForCausalLM.from_pretrained("exported/").generate(...)
    # stops at the tokenizer's end-of-document id

This module imports neither torch nor numpy: each is imported by the function that
handles its arrays.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from baton.core.checkpoints.files import META_FILE

#: the weights file a model directory written here holds
WEIGHTS_FILE = "model.safetensors"
#: the config entries of the special-token ids (``config.json`` and ``generation_config.json``)
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: a run's tokenizer files copied beside the exported weights
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",  # the chat template, where transformers saves it
    "chat_template.json",  # the same, as older transformers save it
)


def read_safetensors(
    source: str | Path, *, framework: Literal["torch", "numpy"] = "torch"
) -> dict[str, Any]:
    """Every tensor of a ``save_pretrained`` directory (one or several ``*.safetensors``
    files) or of one ``.safetensors`` file, as torch tensors or NumPy arrays."""
    path = Path(source)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(
            f"{path} holds no .safetensors weights; pass a Hugging Face model directory "
            "(save_pretrained) or a .safetensors file"
        )
    if framework == "torch":
        from safetensors.torch import load_file
    else:
        from safetensors.numpy import load_file
    weights: dict[str, Any] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def write_safetensors(weights: Mapping[str, Any], file: str | Path) -> None:
    """Write torch tensors or NumPy arrays (contiguous copies where needed) to ``file``."""
    first = next(iter(weights.values()), None)
    if type(first).__module__.startswith("torch"):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, str(file), {"format": "pt"})
    else:
        import numpy as np
        from safetensors.numpy import save_file

        arrays = {k: np.ascontiguousarray(v) for k, v in weights.items()}
        save_file(arrays, str(file), {"format": "pt"})


def run_tokenizer(checkpoint: str | Path) -> str | None:
    """The tokenizer directory a baton checkpoint's run trained with (its recorded
    ``tokenizer`` setting), or ``None`` for a run without one (UTF-8 bytes).
    ``checkpoint`` is a checkpoint directory, its ``backend`` folder or a folder in it."""
    path = Path(checkpoint)
    for meta in (path / META_FILE, path.parent / META_FILE, path.parent.parent / META_FILE):
        if meta.is_file():
            tokenizer = json.loads(meta.read_text()).get("settings", {}).get("tokenizer")
            return tokenizer if isinstance(tokenizer, str) else None
    return None


def special_ids(config: Mapping[str, Any], tokenizer: str | Path | None) -> dict[str, int | None]:
    """The ``bos``/``eos``/``pad`` ids an exported model carries: the run tokenizer's
    (its end-of-document token is the ``eos``), else those ``config`` already names,
    ``None`` for the rest (never ``transformers``' Llama defaults, 1 and 2)."""
    if tokenizer is None:
        return {name: config.get(name) for name in SPECIAL_IDS}
    from baton.data.tokenizer import load_tokenizer, special_token_ids

    return special_token_ids(load_tokenizer(tokenizer))


def write_model(
    out_dir: str | Path,
    weights: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    tokenizer: str | Path | None = None,
) -> Path:
    """Write a Hugging Face model directory: ``model.safetensors``, ``config.json``
    (``config`` with the special-token ids of :func:`special_ids`),
    ``generation_config.json`` with the same ids, and the tokenizer's files when the run
    had a tokenizer directory. Returns ``out_dir``."""
    out = write_config(out_dir, config, tokenizer=tokenizer)
    write_safetensors(weights, out / WEIGHTS_FILE)
    if tokenizer is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer) / name).is_file():
                shutil.copyfile(Path(tokenizer) / name, out / name)
    return out


def write_config(
    out_dir: str | Path, config: Mapping[str, Any], *, tokenizer: str | Path | None = None
) -> Path:
    """Write a model directory's ``config.json`` (``config`` with the special-token ids of
    :func:`special_ids`) and ``generation_config.json`` (the same ids), no weights: what
    builds the architecture and says where generation stops. Returns ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = special_ids(config, tokenizer)
    _write_json(out / "config.json", {**config, **ids})
    _write_json(out / "generation_config.json", {**ids, "_from_model_config": False})
    return out


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n")
