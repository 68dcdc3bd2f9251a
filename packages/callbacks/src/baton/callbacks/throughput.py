"""Throughput: tokens/s, samples/s, step time and MFU over each log window.

Example::

    Driver(backend, callbacks=[ThroughputMonitor()], log_every=10)
    # on H100s: metrics["throughput/mfu"] == 0.41

Rates count training time only: the time the driver spent evaluating and blocked in
checkpoint saves in the window (``driver.eval_time_s``, ``driver.save_blocking_s``) is
left out. MFU = tokens/s x ``backend.flops_per_token`` / (peak FLOP/s x world size), with the
peak from ``baton.callbacks.device_flops`` for the ``precision`` in use (NVIDIA GPUs
through Lightning's table, TPU v4/v5e/v5p/v6e, AMD MI300) or the ``peak_flops``
argument; on a CPU (no known peak) MFU is not logged.

Metric keys logged: ``throughput/samples_per_s``, ``throughput/step_time_s``, and for
a model whose steps count tokens ``throughput/tokens_per_s``,
``throughput/tflops_per_device`` (when the backend reports flops per token) and
``throughput/mfu`` (when the peak is known). A model that counts no tokens (a regressor,
an image classifier) gets no token rate: samples per second is its throughput.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from baton.callbacks.device_flops import device_name, peak_flops, precision_key
from baton.core.callback import METRIC_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView


@CALLBACKS.register("throughput")
class ThroughputMonitor(Callback):
    """Log tokens/s, samples/s, step time and MFU (from the backend's flops per token).

    Args:
        peak_flops: peak FLOP/s of one device (None: the table's for the device found).
        precision: the table's column: bf16, fp16, fp32, fp8, or a Lightning precision
            such as bf16-mixed.
    """

    priority = METRIC_PRIORITY

    def __init__(self, peak_flops: float | None = None, precision: str = "bf16") -> None:
        """``peak_flops`` per device overrides the table; ``precision`` (``bf16``,
        ``fp16``, ``fp32``, ``fp8``, or a Lightning precision such as ``bf16-mixed``)
        picks the table's column."""
        precision_key(precision)  # fails now on an unknown name
        self.peak_flops = peak_flops
        self.precision = precision
        self._window: tuple[float, float, int, int, int] | None = None

    def on_train_start(self, driver: DriverView) -> None:
        if self.peak_flops is None:
            self.peak_flops = peak_flops(device_name(driver.backend.device_type), self.precision)
        self._reset(driver)

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        self._reset(driver)  # a rollback moves the counters back

    @staticmethod
    def _paused(driver: DriverView) -> float:
        return driver.eval_time_s + driver.save_blocking_s

    def _reset(self, driver: DriverView) -> None:
        self._window = (
            time.perf_counter(),
            self._paused(driver),
            driver.step,
            driver.tokens,
            driver.samples,
        )

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self._window is None:
            return
        then, paused0, step0, tokens0, samples0 = self._window
        steps = driver.step - step0
        if steps <= 0:
            return
        # training time only: evaluation and the blocking part of saves are left out
        paused = self._paused(driver) - paused0
        seconds = max(time.perf_counter() - then - paused, 1e-9)
        metrics["throughput/samples_per_s"] = (driver.samples - samples0) / seconds
        metrics["throughput/step_time_s"] = seconds / steps
        if driver.tokens == 0:  # not a token model: no token rate, no MFU from tokens
            self._reset(driver)
            return
        tokens_per_s = (driver.tokens - tokens0) / seconds
        metrics["throughput/tokens_per_s"] = tokens_per_s
        flops_per_token = driver.backend.flops_per_token
        if flops_per_token:
            per_device = tokens_per_s * flops_per_token / driver.backend.world_size
            metrics["throughput/tflops_per_device"] = per_device / 1e12
            if self.peak_flops:
                metrics["throughput/mfu"] = per_device / self.peak_flops
        self._reset(driver)
