"""A live progress display: step, loss, tokens/s and ETA (rich), on rank 0.

Example::

    Driver(backend, callbacks=[Progress()], max_steps=300)

Reads ``loss`` and, when present, ``eval/loss`` from log-step metrics; logs nothing.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from baton.core.callback import Callback
from baton.core.registry import CALLBACKS


@CALLBACKS.register("progress")
class Progress(Callback):
    """Live progress bar with step, loss, tokens/s and ETA (rank 0 only)."""

    priority = 200  # after monitors, so their metrics are there

    def __init__(self, console: Console | None = None, refresh_per_second: float = 4.0) -> None:
        self.console = console or Console(stderr=True)
        self.refresh_per_second = refresh_per_second
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._last = (0.0, 0)
        self._loss = float("nan")
        self._rate = 0.0

    def on_train_start(self, driver: Any) -> None:
        if not driver.is_global_zero:
            return
        self._bar = RichProgress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=self.console,
            refresh_per_second=self.refresh_per_second,
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            "train", total=driver.max_steps, completed=driver.step, info=""
        )
        self._last = (time.monotonic(), driver.tokens)

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        if self._bar is None:
            return
        now = time.monotonic()
        then, tokens_then = self._last
        if driver.tokens > tokens_then:  # an eval-only log keeps the last rate
            self._rate = (driver.tokens - tokens_then) / max(now - then, 1e-9)
            self._last = (now, driver.tokens)
        self._loss = metrics.get("loss", self._loss)
        info = f"loss {self._loss:.4f}  {self._rate:,.0f} tok/s"
        if "eval/loss" in metrics:
            info += f"  eval {metrics['eval/loss']:.4f}"
        self._bar.update(self._task, completed=driver.step, info=info)

    def on_train_end(self, driver: Any) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=driver.step)

    def on_teardown(self, driver: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
