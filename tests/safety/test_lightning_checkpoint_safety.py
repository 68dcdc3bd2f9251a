"""Loading a LightningModule run's checkpoint never runs code from it: its ``state.pt`` is
unpickled weights-only under the allow-list every backend's checkpoints load under. A
crafted file (one entry whose reduce would create a file) is refused, naming the file,
whether it is met resuming or asked whether it holds the loop's state, and the file is
not created; what a module legitimately saves still comes back."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import pytest
import torch

from baton.backends.dcp_safety import UnsafeCheckpointError
from baton.backends.fabric import FabricConfig
from baton.backends.lightning import LightningBackend
from baton.backends.lightning.checkpoint_io import holds_loop_state
from baton.core import CheckpointError, Driver
from baton.core.checkpoints import files as ckpt

ROOT = Path(__file__).resolve().parents[2]


def recipe_module():
    spec = importlib.util.spec_from_file_location(
        "lightning_module_recipe_safety", ROOT / "recipes" / "lightning_module.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lit = recipe_module()


class CreatesAFile:
    """Unpickling this opens (creates) ``path``: the stand-in for arbitrary code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


class KeepsExtras(lit.LitClassifier):
    """Saves what a module may legitimately keep: tensors, numbers, strings, a path, a
    numpy array, nested containers."""

    loaded: dict | None = None

    def on_save_checkpoint(self, checkpoint):
        import numpy as np

        checkpoint["extras"] = {
            "mean": torch.arange(3.0),
            "seen": [1, 2.5, "three", None, (4, 5)],
            "where": Path("data/blobs"),
            "counts": np.arange(4, dtype=np.int64),
            "dtype": torch.bfloat16,
        }

    def on_load_checkpoint(self, checkpoint):
        KeepsExtras.loaded = checkpoint["extras"]


def backend() -> LightningBackend:
    return LightningBackend(
        KeepsExtras(), datamodule=lit.BlobsDataModule(), config=FabricConfig(accelerator="cpu")
    )


def craft(checkpoint: Path, marker: Path) -> Path:
    """Add a code-running entry to the checkpoint's ``state.pt`` and fix up baton's
    manifest, as an attacker who can write the checkpoint would."""
    state_file = checkpoint / ckpt.BACKEND_DIR / "state.pt"
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    state["lightning"]["extras"]["evil"] = CreatesAFile(marker)
    torch.save(state, state_file)
    meta = json.loads((checkpoint / ckpt.META_FILE).read_text())
    meta["files"] = ckpt.manifest(checkpoint / ckpt.BACKEND_DIR)
    (checkpoint / ckpt.META_FILE).write_text(json.dumps(meta))
    return state_file


def test_extras_round_trip_and_a_crafted_state_file_is_refused(tmp_path):
    torch.manual_seed(0)
    driver = Driver(backend(), max_steps=2, run_dir=tmp_path)
    driver.options = driver.options.replace(save_on_stop=True)
    driver.fit()
    resumed = Driver(backend(), max_steps=3, run_dir=tmp_path, resume="auto")
    resumed.options = resumed.options.replace(save_on_stop=True)
    resumed.fit()
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "step_000002"
    extras = KeepsExtras.loaded
    assert extras is not None and torch.equal(extras["mean"], torch.arange(3.0))
    assert extras["seen"] == [1, 2.5, "three", None, (4, 5)]
    assert extras["where"] == Path("data/blobs") and extras["dtype"] is torch.bfloat16
    assert extras["counts"].tolist() == [0, 1, 2, 3]

    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    state_file = craft(checkpoint, marker)
    attacked = Driver(backend(), max_steps=4, run_dir=tmp_path, resume=str(checkpoint))
    with pytest.raises(CheckpointError) as raised:
        attacked.fit()
    message = str(raised.value)
    assert "refused to load" in message and str(state_file) in message
    assert "open" in message and "Traceback" not in message
    assert not marker.exists()

    # asked whether it holds the loop's state (a checkpoint recorded under the old name)
    with pytest.raises(UnsafeCheckpointError, match="refused to load") as asked:
        holds_loop_state(checkpoint / ckpt.BACKEND_DIR)
    assert isinstance(asked.value, CheckpointError) and str(state_file) in str(asked.value)
    assert not marker.exists()


def test_a_damaged_state_file_is_not_called_unsafe(tmp_path):
    """A pickle that is merely cut short fails as a damaged file, not as a refusal."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "state.pt").write_bytes(pickle.dumps({"model": {}})[:-3])
    with pytest.raises(Exception) as raised:
        holds_loop_state(plain)
    assert not isinstance(raised.value, UnsafeCheckpointError)
