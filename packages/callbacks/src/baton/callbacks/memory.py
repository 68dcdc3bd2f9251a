"""Memory: peak device memory (torch or jax, whichever the backend runs on) and host RSS.

Example::

    Driver(backend, callbacks=[MemoryMonitor()])

Device figures come from the array library already loaded by the backend (never
imported here): ``torch.cuda`` memory statistics when ``backend.device_type`` is
``cuda``, ``jax`` device ``memory_stats()`` on GPU/TPU. CPU runs report host RSS only.

Metric keys logged: ``memory/host_rss_gib``; on accelerators
``memory/device_peak_gib`` (peak since the last log step), and with torch
``memory/device_reserved_gib``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

import psutil

from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView

GIB = float(1 << 30)


def device_memory(device_type: str) -> dict[str, float]:
    """Peak (and reserved) device memory in GiB, resetting the peak; ``{}`` on CPU."""
    if device_type == "cuda" and "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            out = {
                "memory/device_peak_gib": torch.cuda.max_memory_allocated() / GIB,
                "memory/device_reserved_gib": torch.cuda.memory_reserved() / GIB,
            }
            torch.cuda.reset_peak_memory_stats()
            return out
    if device_type in ("gpu", "tpu", "cuda") and "jax" in sys.modules:
        import jax

        device: Any = cast(Any, jax).local_devices()[0]
        stats: dict[str, Any] = device.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return {"memory/device_peak_gib": stats["peak_bytes_in_use"] / GIB}
    return {}


@CALLBACKS.register("memory")
class MemoryMonitor(Callback):
    """Log peak device memory and host RSS on log steps."""

    priority = METRIC_PRIORITY

    def __init__(self) -> None:
        self._process = psutil.Process()

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        metrics["memory/host_rss_gib"] = self._process.memory_info().rss / GIB
        metrics.update(device_memory(driver.backend.device_type))
