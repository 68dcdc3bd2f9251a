"""Loading a TorchTitan or Megatron-Core checkpoint never runs code from it: a crafted
``.metadata`` (a pickle whose reduce would create a file) is refused with a clear error
and the file is not created, while real checkpoints of both backends still resume."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from baton.core import CheckpointError
from baton.core.checkpoints import files as ckpt
from baton.core.cli.recipe import build_driver

ROOT = Path(__file__).resolve().parents[2]


class CreatesAFile:
    """Unpickling this opens (creates) ``path``: the stand-in for arbitrary code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def craft(checkpoint: Path, marker: Path) -> None:
    """Replace the checkpoint's DCP metadata and fix up baton's manifest, as an attacker
    who can write the checkpoint would: checksums alone cannot catch this."""
    (metadata,) = (checkpoint / ckpt.BACKEND_DIR).rglob(".metadata")
    metadata.write_bytes(pickle.dumps(CreatesAFile(marker)))
    meta = json.loads((checkpoint / ckpt.META_FILE).read_text())
    meta["files"] = ckpt.manifest(checkpoint / ckpt.BACKEND_DIR)
    (checkpoint / ckpt.META_FILE).write_text(json.dumps(meta))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "flags"),
    [
        ("megatron_gpt_tiny.py", ["--no-async-save"]),
        ("torchtitan_llama3_debug.py", []),
    ],
    ids=["megatron", "torchtitan"],
)
def test_crafted_metadata_is_refused_and_real_checkpoints_load(tmp_path, recipe, flags):
    import torch

    torch.set_num_threads(1)
    path = ROOT / "recipes" / recipe
    common = ["--run-dir", str(tmp_path), "--save-every", "1", "--log-every", "1"]
    common += ["--no-progress", "--allow-changed", "max_steps", *flags]
    build_driver(path, [*common, "--max-steps", "1"]).fit()
    resumed = build_driver(path, [*common, "--max-steps", "2", "--resume", "auto"])
    resumed.fit()  # a real checkpoint passes the restricted loader
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "step_000001"
    assert "dcp_safe_loading" in " ".join(p.name for p in resumed.patch_report if p.applied)

    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    craft(checkpoint, marker)
    attacked = build_driver(path, [*common, "--max-steps", "3", "--resume", str(checkpoint)])
    with pytest.raises(CheckpointError) as raised:
        attacked.fit()
    assert "refused to load" in str(raised.value)
    assert "open is not allowed" in str(raised.value) and "Traceback" not in str(raised.value)
    assert not marker.exists()
