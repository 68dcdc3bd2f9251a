"""A live progress display: step, loss, tokens/s (samples/s) and ETA (rich), on rank 0.

Example::

    Driver(backend, callbacks=[Progress()], max_steps=300)

The bar advances every step from host counters (no device value is read between log
steps); the loss and the rate come from log steps and ``eval/loss`` from evaluations.
The rate is tokens/s for a model whose steps count tokens, samples/s otherwise. Logs
nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from baton.core.callback import DISPLAY_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput


@CALLBACKS.register("progress")
class Progress(Callback):
    """Live progress bar with step, loss, tokens/s (or samples/s) and ETA (rank 0 only).

    Args:
        console: the rich console drawn on (None: stderr).
        refresh_per_second: redraws per second.
    """

    priority = DISPLAY_PRIORITY

    def __init__(self, console: Console | None = None, refresh_per_second: float = 4.0) -> None:
        self.console = console or Console(stderr=True)
        self.refresh_per_second = refresh_per_second
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._last = (0.0, 0)
        self._loss: float | None = None
        self._rate: tuple[float, str] | None = None
        self._eval_loss: float | None = None

    def on_train_start(self, driver: DriverView) -> None:
        if not driver.is_global_zero or driver.evaluating_only:  # `baton eval`: no steps
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
            "train", total=driver.options.max_steps, completed=driver.step, info=""
        )
        self._last = (time.monotonic(), self._count(driver)[0])

    @staticmethod
    def _count(driver: DriverView) -> tuple[int, str]:
        """Tokens for a token model, else samples: what the rate counts."""
        return (driver.tokens, "tok/s") if driver.tokens else (driver.samples, "samples/s")

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        # host counters only (no device value is read): the bar moves every step
        if self._bar is not None:
            self._bar.update(self._task, completed=driver.step)

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        now = time.monotonic()
        then, count_then = self._last
        count, unit = self._count(driver)
        if count > count_then:
            self._rate = ((count - count_then) / max(now - then, 1e-9), unit)
            self._last = (now, count)
        self._loss = metrics.get("loss", self._loss)
        self._show(driver)

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._eval_loss = metrics.get("eval/loss", metrics.get("val_loss", self._eval_loss))
        self._show(driver)

    def _show(self, driver: DriverView) -> None:
        if self._bar is None:
            return
        parts = [] if self._loss is None else [f"loss {self._loss:.4f}"]
        if self._rate is not None:
            rate, unit = self._rate
            parts.append(f"{rate:,.0f} {unit}" if rate >= 100 else f"{rate:.3g} {unit}")
        if self._eval_loss is not None:
            parts.append(f"eval {self._eval_loss:.4f}")
        info = "  ".join(parts)
        self._bar.update(self._task, completed=driver.step, info=info)

    def on_train_end(self, driver: DriverView) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=driver.step)

    def on_teardown(self, driver: DriverView) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
