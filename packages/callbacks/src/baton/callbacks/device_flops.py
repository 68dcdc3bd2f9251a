"""Peak dense FLOP/s of one device for the precision in use, for MFU.

Example::

    peak_flops("NVIDIA H100 80GB HBM3")            # 989e12 (bf16)
    peak_flops("NVIDIA H100 80GB HBM3", "fp8")     # 1979e12
    peak_flops("TPU v5p")                          # 459e12
    peak_flops("cpu")                              # None: no meaningful peak

One table for every backend (callbacks never import a framework, so Lightning's
``get_available_flops`` cannot be used here): NVIDIA's data-center GPUs with the same
vendor numbers Lightning's table carries, TPUs where MaxText and the JAX backend run,
and AMD Instinct. Numbers are dense (no sparsity) peaks per device as JAX and torch
count devices.
"""

from __future__ import annotations

import sys
from typing import Any, cast

#: precision names -> the key used in ``TABLE``; Lightning-style strings are accepted
_PRECISIONS = {
    "bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "16": "fp16", "16-mixed": "fp16", "16-true": "fp16", "float16": "fp16",
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "float32": "fp32",
    "tf32": "tf32", "fp8": "fp8", "int8": "int8",
}  # fmt: skip

#: substring of the device name (lower case) -> {precision: peak FLOP/s}; first match wins.
#: TPUs compute matmuls in bf16 whatever the parameter dtype; sources are the vendors'
#: datasheets (Cloud TPU system architecture pages, AMD Instinct and NVIDIA datasheets).
TABLE: tuple[tuple[str, dict[str, float]], ...] = (
    ("tpu v6", {"bf16": 918e12, "fp32": 918e12, "int8": 1836e12}),  # v6e (Trillium)
    ("tpu v5p", {"bf16": 459e12, "fp32": 459e12, "int8": 918e12}),
    ("tpu v5 lite", {"bf16": 197e12, "fp32": 197e12, "int8": 394e12}),  # v5e
    ("tpu v5e", {"bf16": 197e12, "fp32": 197e12, "int8": 394e12}),
    ("tpu v5", {"bf16": 459e12, "fp32": 459e12, "int8": 918e12}),  # v5p reports "TPU v5"
    ("tpu v4", {"bf16": 275e12, "fp32": 275e12, "int8": 275e12}),
    ("tpu v3", {"bf16": 61.5e12, "fp32": 61.5e12}),  # per core: a v3 chip is two devices
    ("mi300x", {"bf16": 1307e12, "fp16": 1307e12, "fp8": 2615e12, "fp32": 163.4e12}),
    ("mi300a", {"bf16": 980.6e12, "fp16": 980.6e12, "fp8": 1961e12, "fp32": 122.6e12}),
    ("mi250x", {"bf16": 383e12, "fp16": 383e12, "fp32": 95.7e12}),
    ("b200", {"bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12, "tf32": 1100e12, "fp32": 80e12}),
    ("h200", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    ("h100 pcie", {"bf16": 756e12, "fp16": 756e12, "fp8": 1513e12, "tf32": 378e12, "fp32": 51e12}),
    ("h100", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    ("h800", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}),
    ("a100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("a800", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("l40s", {"bf16": 362e12, "fp16": 362e12, "fp8": 733e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("l40", {"bf16": 181e12, "fp16": 181e12, "fp8": 362e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    ("l4", {"bf16": 121e12, "fp16": 121e12, "fp8": 242e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("a10g", {"bf16": 70e12, "fp16": 70e12, "tf32": 35e12, "fp32": 31.2e12}),
    ("v100", {"fp16": 125e12, "fp32": 15.7e12}),
)


def precision_key(precision: str) -> str:
    """``bf16``, ``fp16``, ``fp32``, ``tf32``, ``fp8`` or ``int8`` for a precision name."""
    key = _PRECISIONS.get(precision.lower())
    if key is None:
        known = ", ".join(sorted(set(_PRECISIONS)))
        raise ValueError(f"unknown precision {precision!r}; known: {known}")
    return key


def peak_flops(device_name: str, precision: str = "bf16") -> float | None:
    """Peak FLOP/s of one device by name for ``precision``; ``None`` when unknown."""
    key = precision_key(precision)
    name = device_name.lower()
    for match, peaks in TABLE:
        if match in name:
            return peaks.get(key)
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
