"""Profile a window of steps with the backend's own profiler and write a trace file.

Example::

    Driver(backend, callbacks=[Profiler(start_step=10, num_steps=3)])
    # torch: <run_dir>/logs/profiler/trace_steps_10-12_rank0.json (open in chrome://tracing
    #        or https://ui.perfetto.dev); jax: a TensorBoard profile under the same folder

Which profiler runs follows the arrays the backend's step returns: torch tensors
use ``torch.profiler`` (CPU and, on CUDA, GPU activity); jax arrays use
``jax.profiler``. Neither library is imported here unless the backend already did.

Metric keys logged: none.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.core.callback import Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput

log = logging.getLogger("baton")


def array_library(value: Any) -> str | None:
    """``"torch"`` or ``"jax"`` for an array of either, else ``None``."""
    module = type(value).__module__
    for name in ("torch", "jax", "jaxlib"):
        if module == name or module.startswith(name + "."):
            return "jax" if name == "jaxlib" else name
    return None


@CALLBACKS.register("profiler")
class Profiler(Callback):
    """Trace steps ``start_step .. start_step + num_steps - 1`` into ``logs/profiler``.

    Args:
        start_step: the first step traced (at least 2: the first step compiles).
        num_steps: steps traced.
        output_dir: where the trace goes (None: the run's logs/profiler).
    """

    def __init__(
        self, start_step: int = 5, num_steps: int = 3, output_dir: str | Path | None = None
    ) -> None:
        if start_step < 2:
            raise ValueError(
                f"start_step must be >= 2 (one step first tells which profiler), got {start_step}"
            )
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.start_step = start_step
        self.num_steps = num_steps
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.library: str | None = None
        self.trace_path: Path | None = None
        self._active: Any = None

    @property
    def end_step(self) -> int:
        return self.start_step + self.num_steps - 1

    def on_step_start(self, driver: DriverView) -> None:
        if driver.step + 1 != self.start_step or self.library is None:
            return
        out = self.output_dir or Path(driver.log_dir) / "profiler"
        out.mkdir(parents=True, exist_ok=True)
        if self.library == "torch":
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if driver.backend.device_type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._active = torch.profiler.profile(activities=activities, record_shapes=True)
            self._active.__enter__()
            name = f"trace_steps_{self.start_step}-{self.end_step}_rank{driver.backend.rank}.json"
            self.trace_path = out / name
        else:
            import jax

            jax.profiler.start_trace(str(out))  # pyright: ignore[reportUnknownMemberType]
            self._active = "jax"
            self.trace_path = out
        log.info("profiling steps %d..%d", self.start_step, self.end_step)

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if self.library is None:
            self.library = array_library(output.loss)
        if self._active is not None and driver.step >= self.end_step:
            self._stop(driver)

    def _stop(self, driver: DriverView) -> None:
        active, self._active = self._active, None
        if active == "jax":
            import jax

            jax.profiler.stop_trace()  # pyright: ignore[reportUnknownMemberType]
        else:
            active.__exit__(None, None, None)
            active.export_chrome_trace(str(self.trace_path))
        log.info("profile written to %s", self.trace_path)

    def on_teardown(self, driver: DriverView) -> None:
        if self._active is not None:  # the run ended inside the window
            self._stop(driver)
