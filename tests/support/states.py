"""Saved training states read back and compared bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_state(checkpoint: Path) -> dict:
    """The Fabric backend's saved state of a checkpoint directory."""
    import torch

    return torch.load(checkpoint / "backend" / "state.pt", map_location="cpu", weights_only=False)


def assert_bitwise_equal(a: Any, b: Any, where: str = "state") -> None:
    """Recursively compare two saved states; tensors must be bitwise identical."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
