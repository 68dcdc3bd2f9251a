"""Host syncs: device-to-host transfers the driver causes on steps that do not log.

baton keeps step outputs as device values and brings them to the host once per log
step (``backend.fetch``). This benchmark trains the Fabric backend with the standard
callbacks and attributes every host materialisation to where it happened: inside
the backend's ``train_step`` (the backend's own business), inside ``fetch`` (the one
transfer of a log step), or anywhere else: the driver and the callbacks. Target: zero
of the last kind on steps that do not log.

How it counts:

* on CPU, a ``TorchFunctionMode`` sees every call that would bring a tensor to the
  host on a GPU: ``item``, ``tolist``, ``cpu``, ``numpy``, ``to("cpu")`` and the
  ``__float__``/``__int__``/``__bool__``/``__index__``/``__format__`` conversions;
* on a GPU additionally ``torch.cuda.set_sync_debug_mode("warn")``, whose warnings
  (one per synchronising CUDA call) are attributed the same way.

Run alone: ``uv run python benchmarks/run.py --only host_syncs``.

Example (any torch backend)::

    report = count_host_syncs(Driver(backend, callbacks, max_steps=30, log_every=10))
    report.outside_backend(non_log_only=True)   # -> 0 is the target
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from baton.core import Callback, Driver
from benchmarks.harness import Row

NAME = "host_syncs"

#: Tensor methods that materialise a value on the host (a device-to-host copy on a GPU).
MATERIALISING = frozenset(
    {
        "item",
        "tolist",
        "cpu",
        "numpy",
        "__float__",
        "__int__",
        "__bool__",
        "__index__",
        "__format__",
    }
)


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to(...)`` call names the CPU as its destination."""
    for value in (*args[1:], *kwargs.values()):
        if isinstance(value, torch.device) and value.type == "cpu":
            return True
        if isinstance(value, str) and value.startswith("cpu"):
            return True
    return False


#: backend calls whose materialisations are the backend's own business
BACKEND_CALLS = ("setup", "train_step", "evaluate", "save", "load", "teardown")


@dataclass
class SyncReport:
    """Materialisations by (phase, step); phase is ``backend``, ``fetch`` or ``driver``."""

    steps: int
    log_steps: set[int] = field(default_factory=set)
    events: list[tuple[str, int, str]] = field(default_factory=list)  # (phase, step, what)

    def _selected(self, phase: str, non_log_only: bool) -> list[str]:
        """What was materialised in ``phase`` during the loop (steps 1..N)."""
        return [
            what
            for p, step, what in self.events
            if p == phase
            and 1 <= step <= self.steps
            and not (non_log_only and step in self.log_steps)
        ]

    def count(self, phase: str, *, non_log_only: bool) -> int:
        return len(self._selected(phase, non_log_only))

    def outside_backend(self, *, non_log_only: bool) -> int:
        """Materialisations by the driver and the callbacks (not in the backend or fetch)."""
        return self.count("driver", non_log_only=non_log_only)

    def what(self, phase: str, *, non_log_only: bool = False) -> str:
        found = Counter(self._selected(phase, non_log_only))
        return ", ".join(f"{name} x{n}" for name, n in found.most_common()) or "none"

    @property
    def non_log_steps(self) -> int:
        return self.steps - len(self.log_steps)


class _Phase(Callback):
    """Where the loop is: the step being run, and inside which part of it.

    As a callback it runs first in ``on_step_start``, so everything from there to the
    next step's start (the backend's step, ``on_step_end``, the log step) counts
    toward that step. It materialises nothing itself.
    """

    priority = -(10**9)

    def __init__(self) -> None:
        self.step = 0
        self.name = "driver"

    def on_step_start(self, driver: Any) -> None:
        self.step = driver.step + 1

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[None]:
        outer, self.name = self.name, name
        try:
            yield
        finally:
            self.name = outer


class _CountMaterialisations(TorchFunctionMode):
    def __init__(self, phase: _Phase, report: SyncReport) -> None:
        super().__init__()
        self.phase = phase
        self.report = report

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in MATERIALISING or (name == "to" and _to_host(args, kwargs)):
            self.report.events.append((self.phase.name, self.phase.step, name))
        return func(*args, **kwargs)


def _wrap(phase: _Phase, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with phase.inside(name):
            return method(*args, **kwargs)

    return wrapped


@contextlib.contextmanager
def _cuda_sync_warnings(phase: _Phase, report: SyncReport) -> Iterator[None]:
    """On a GPU: every synchronising CUDA call warns; attribute each to the phase."""
    if not torch.cuda.is_available():
        yield
        return

    def show(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if "synchroniz" in str(message):
            report.events.append((phase.name, phase.step, "cuda-sync"))

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def count_host_syncs(driver: Driver) -> SyncReport:
    """Run ``driver.fit()`` while attributing every host materialisation to a phase."""
    if driver.options.max_steps is None:
        raise ValueError("count_host_syncs needs a driver with max_steps set")
    report = SyncReport(steps=driver.options.max_steps)
    phase = _Phase()
    backend = driver.backend
    fetch = backend.fetch

    def fetch_and_note(values: Any) -> Any:
        report.log_steps.add(phase.step)
        return fetch(values)

    wrapped = {name: _wrap(phase, "backend", getattr(backend, name)) for name in BACKEND_CALLS}
    wrapped["fetch"] = _wrap(phase, "fetch", fetch_and_note)
    for name, method in wrapped.items():
        setattr(backend, name, method)
    driver.callbacks = [phase, *driver.callbacks]
    try:
        with _CountMaterialisations(phase, report), _cuda_sync_warnings(phase, report):
            driver.fit()
    finally:
        for name in wrapped:
            delattr(backend, name)  # the class's methods again
        driver.callbacks.remove(phase)
    return report


def run(quick: bool = False) -> list[Row]:
    from rich.console import Console

    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining
    from baton.callbacks import Progress

    steps, log_every = (20, 10) if quick else (50, 10)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = GPTTraining(
        model=GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=32),
        batch_size=4,
        warmup_steps=5,
        accelerator=device,
    )
    with tempfile.TemporaryDirectory(prefix="baton-bench-syncs-") as tmp:
        callbacks = [Progress(console=Console(file=io.StringIO()))]
        driver = Driver(
            config.backend(),
            callbacks,
            max_steps=steps,
            log_every=log_every,
            run_dir=Path(tmp),
        )
        report = count_host_syncs(driver)

    how = "sync debug mode + torch function mode" if device == "cuda" else "torch function mode"
    expected_logs = {s for s in range(1, steps + 1) if s % log_every == 0 or s == steps}
    driver_syncs = report.outside_backend(non_log_only=True) / max(1, report.non_log_steps)
    backend_syncs = report.count("backend", non_log_only=False) / steps
    fetches = report.count("fetch", non_log_only=False) / max(1, len(report.log_steps))
    return [
        Row(
            NAME,
            "driver + Progress, non-log steps",
            driver_syncs,
            "per step",
            target="== 0",
            passed=driver_syncs == 0,
            note=f"{report.non_log_steps} steps, {device}, {how}; seen: {report.what('driver', non_log_only=True)}",
        ),
        Row(
            NAME,
            "fetch only on log steps",
            len(report.log_steps),
            "fetches",
            target=f"== {len(expected_logs)}",
            passed=report.log_steps == expected_logs,
            note=f"log_every={log_every}; per fetch: {report.what('fetch')} ({fetches:g} calls)",
        ),
        Row(
            NAME,
            "Fabric backend's own train_step",
            backend_syncs,
            "calls/step",
            note=f"the backend's, not the driver's: {report.what('backend')} over {steps} steps"
            + ("" if device == "cuda" else " (on CPU every tensor is host-resident: upper bound)"),
        ),
    ]
