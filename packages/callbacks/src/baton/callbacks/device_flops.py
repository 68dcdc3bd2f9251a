"""Peak dense bf16 FLOP/s per device, for MFU. CPUs report none (no meaningful peak).

Example::

    peak_flops("NVIDIA H100 80GB HBM3")   # 989e12
    peak_flops("cpu")                     # None

Numbers are the vendors' dense (no sparsity) bf16 tensor peaks.
"""

from __future__ import annotations

import sys
from typing import Any, cast

#: substring of the device name (lower case) -> peak dense bf16 FLOP/s; first match wins
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12),
    ("gh200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),  # SXM / HBM3
    ("a100", 312e12),
    ("mi300x", 1307e12),
    ("mi300", 1307e12),
)


def peak_flops(device_name: str) -> float | None:
    """Peak FLOP/s of one device by name, or ``None`` when unknown (CPU included)."""
    name = device_name.lower()
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def device_name(device_type: str) -> str:
    """The accelerator's marketing name, asked of an array library that is already
    loaded (never importing torch or jax); the device type itself otherwise."""
    if device_type == "cuda" and "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    if device_type in ("gpu", "tpu", "cuda") and "jax" in sys.modules:
        import jax

        devices: list[Any] = cast(Any, jax).devices()
        if devices:
            return str(devices[0].device_kind)
    return device_type
