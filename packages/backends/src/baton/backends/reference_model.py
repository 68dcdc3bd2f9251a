"""The reference model of an objective that compares the policy with one (DPO's stored
log-probabilities, GRPO's KL term), the same on every engine: which weights it is, the
check that they are the policy's architecture and read the data's tokenizer, and their
fingerprint (the name of stored log-probabilities, and a recorded setting a resume may
not change). Each engine keeps only what is its own: scoring rows with those weights.

The reference is ``--reference`` (a Hugging Face directory or a baton checkpoint) or, by
default, the run's starting weights (``--init-from``); an engine that starts from a
random initialisation may take that as the reference, fingerprinted by the facts that
decide it (its seed and shapes).

Example::

    source = reference_source(run, init_from)                   # --reference or --init-from
    if source is not None:
        check_reference(source, spec, tokenizer_fingerprint)    # UsageError naming the fix
    fingerprint = reference_fingerprint(source, fresh={"seed": 0, "engine": "torchtitan"})
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from baton.backends.reference_logps import model_fingerprint
from baton.core.checkpoints.files import manifest, native_dir
from baton.core.errors import UsageError
from baton.core.model.spec import (
    FAMILIES,
    ModelSpec,
    check_init_from,
    check_same_architecture,
    is_hf_dir,
)
from baton.core.objectives import ObjectiveRun
from baton.data import fingerprint_file

#: the ``config.json`` fields compared for a model outside baton's spec families
CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")
#: the fix a reference of another architecture is refused with
SAME_ARCHITECTURE = "give a reference of the same architecture"


def reference_source(run: ObjectiveRun, init_from: str | None) -> str | None:
    """The reference's weights: ``--reference``, else the starting weights (``None``:
    neither was given, the run starts from a random initialisation)."""
    given = run.values.get("reference")
    return str(given) if given else init_from


def check_reference(
    source: str | Path,
    spec: ModelSpec | None,
    tokenizer_fingerprint: str | None,
    *,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """The reference's directory; ``UsageError`` (one line, the fix) when it is missing,
    another architecture than the policy's (``spec``; for a model outside baton's spec
    families, ``config``: the policy's ``config.json`` fields), or a Hugging Face directory
    shipping another tokenizer than the data's."""
    path = Path(source)
    what = f"--reference {path}"
    if not path.is_dir():
        raise UsageError(
            f"{what} is not a directory; pass a Hugging Face model directory or a baton checkpoint"
        )
    if not is_hf_dir(path):
        check_init_from(str(path), spec)
        return path
    theirs = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if spec is not None and theirs.get("model_type") in FAMILIES:
        check_same_architecture(
            ModelSpec.from_hf(str(path)).to_dict(), spec.to_dict(), what=what, fix=SAME_ARCHITECTURE
        )
    elif config is not None:
        for name in CONFIG_FIELDS:
            if theirs.get(name) != config.get(name):
                raise UsageError(
                    f"{what} has {name} {theirs.get(name)}, the model {config.get(name)}; "
                    f"{SAME_ARCHITECTURE}"
                )
    own = path / "tokenizer.json"
    if tokenizer_fingerprint and own.is_file() and fingerprint_file(own) != tokenizer_fingerprint:
        raise UsageError(
            f"{what} carries another tokenizer than the one the data was prepared with; "
            "pass a reference trained with the data's tokenizer"
        )
    return path


def reference_fingerprint(
    source: str | Path | None, *, fresh: Mapping[str, Any] | None = None
) -> str:
    """SHA-256 (hex) of the reference's weights: a Hugging Face directory's weight and
    config files (``model_fingerprint``), a baton checkpoint's files (their xxh3-128, as
    its manifest records them), or for a random start the ``fresh`` facts that decide it."""
    if source is not None:
        path = Path(source)
        if is_hf_dir(path) or path.is_file():
            return model_fingerprint(path)
        files = json.dumps(manifest(native_dir(path)), sort_keys=True)
        return hashlib.sha256(files.encode()).hexdigest()
    if fresh is None:
        raise UsageError(
            "the reference is the starting weights, but the run starts from none: pass "
            "--init-from DIR or --reference DIR"
        )
    return hashlib.sha256(json.dumps(dict(fresh), sort_keys=True).encode()).hexdigest()
