"""DPO's reference log-probabilities, stored beside the prepared data and tied to the
reference model, the tokenizer and the data (numpy only: every engine shares it).

``PREFIX.reference-<fingerprint16>.npy`` holds, for every document (sequence) of the
packed preference data at ``PREFIX``, the sum of the reference model's log-probabilities
over its supervised targets (float64, ``[num_sequences]``); ``PREFIX.reference-
<fingerprint16>.json`` records the reference's fingerprint (its weights and config), the
tokenizer's and the data's fingerprints and the engine that computed it. They are
computed once, by the engine that trains, before training; a later run with the same
reference reads them, and a stored file made with another tokenizer or other data is
refused.

Example::

    fingerprint = model_fingerprint("hf_models/sft-export")   # sha256 of weights + config
    logps = stored_or_computed(
        "data/pairs", fingerprint, tokenizer_fingerprint=data.manifest["tokenizer"]["fingerprint"],
        engine="fabric", compute=lambda: my_engine_logps(reference_model, data),
    )
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from baton.core.errors import UsageError

#: files of a model directory that make its fingerprint (weights and architecture)
FINGERPRINTED = (".safetensors", ".bin", ".pt", ".pth", ".json")
#: what a model directory's fingerprint leaves out: files that do not change the weights
NOT_FINGERPRINTED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _hash_files(digest: Any, files: list[Path], root: Path) -> None:
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 22), b""):
                digest.update(block)


def model_fingerprint(source: str | Path) -> str:
    """SHA-256 (hex) of a model's weights and config: the weight and JSON files under a
    Hugging Face directory or checkpoint (a single file: that file)."""
    root = Path(source)
    if root.is_file():
        files, root = [root], root.parent
    elif root.is_dir():
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and p.suffix in FINGERPRINTED and p.name not in NOT_FINGERPRINTED
        )
    else:
        raise UsageError(f"reference model {source} not found; pass --reference HF_DIR")
    if not files:
        raise UsageError(f"{source} holds no weights (*.safetensors, *.bin, *.pt); fix --reference")
    digest = hashlib.sha256()
    _hash_files(digest, files, root)
    return digest.hexdigest()


def data_fingerprint(prefix: str | Path) -> str:
    """SHA-256 (hex) of the prepared data's tokens, index and mask."""
    prefix = str(prefix)
    files = [Path(prefix + suffix) for suffix in (".bin", ".idx", ".mask.bin")]
    digest = hashlib.sha256()
    _hash_files(digest, files, Path(prefix).parent)
    return digest.hexdigest()


def reference_paths(prefix: str | Path, fingerprint: str) -> tuple[Path, Path]:
    """``(PREFIX.reference-<fp16>.npy, PREFIX.reference-<fp16>.json)``."""
    stem = f"{prefix}.reference-{fingerprint[:16]}"
    return Path(stem + ".npy"), Path(stem + ".json")


def stored_or_computed(
    prefix: str | Path,
    fingerprint: str,
    *,
    tokenizer_fingerprint: str,
    engine: str,
    compute: Callable[[], np.ndarray],
    num_sequences: int | None = None,
) -> np.ndarray:
    """The reference log-probabilities of the data at ``prefix`` under the reference whose
    fingerprint is ``fingerprint``: read if stored (its record must name the same
    tokenizer and data, else ``UsageError``), else ``compute()``-d and written atomically."""
    array_path, record_path = reference_paths(prefix, fingerprint)
    data = data_fingerprint(prefix)
    if array_path.is_file() and record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        problems = [
            name
            for name, value in (
                ("reference", fingerprint),
                ("tokenizer", tokenizer_fingerprint),
                ("data", data),
            )
            if record.get(name, {}).get("fingerprint") != value
        ]
        if problems:
            raise UsageError(
                f"{array_path} was computed for another {' and '.join(problems)} than this "
                f"run's; delete {array_path} and {record_path} to compute it again"
            )
        logps = np.load(array_path)
    else:
        logps = np.asarray(compute(), dtype=np.float64)
        record = {
            "reference": {"fingerprint": fingerprint},
            "tokenizer": {"fingerprint": tokenizer_fingerprint},
            "data": {"fingerprint": data},
            "engine": engine,
            "sequences": int(logps.shape[0]),
        }
        _write_atomically(array_path, record_path, logps, record)
    if num_sequences is not None and logps.shape != (num_sequences,):
        raise UsageError(
            f"{array_path} holds {logps.shape} values, the data {num_sequences} documents; "
            f"delete it to compute it again"
        )
    return logps


def _write_atomically(array_path: Path, record_path: Path, logps: np.ndarray, record: dict) -> None:
    partial_array = array_path.with_name(f"{array_path.name}.partial-{os.getpid()}")
    partial_record = record_path.with_name(f"{record_path.name}.partial-{os.getpid()}")
    try:
        with open(partial_array, "wb") as stream:
            np.save(stream, logps)
        partial_record.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(partial_record, record_path)
        os.replace(partial_array, array_path)  # the array last: present means complete
    finally:
        partial_array.unlink(missing_ok=True)
        partial_record.unlink(missing_ok=True)
