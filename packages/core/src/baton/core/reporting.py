"""The loop's two reporting phases: a log step's metrics, brought to the host in one
transfer, and an evaluation, its metrics under the names callbacks see.

Example (what ``Driver`` does on a log step and when evaluation is due)::

    values = LogValues()
    values.record("grad_norm/total", norm)          # driver.record: a callback's lazy value
    metrics = values.fetch(backend, output, tokens=4096, samples=8, train_time_s=12.5)
    driver.dispatch("on_log", metrics)              # {"loss": 2.31, "grad_norm/total": ...}

    metrics = evaluate(backend, driver.dispatch)    # on_eval_start, then on_eval_end(metrics)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.core.abilities import lacking
from baton.core.backend import Backend
from baton.core.metrics import StepOutput, evaluation_keys


class LogValues:
    """Lazy values recorded for the next log step, fetched with the step's own."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] = {}

    def record(self, name: str, value: Any) -> None:
        """Add ``value`` (lazy: a device array is fine) to the next log step's metrics."""
        self._pending[name] = value

    def fetch(
        self,
        backend: Backend,
        output: StepOutput,
        *,
        tokens: int,
        samples: int,
        train_time_s: float,
    ) -> dict[str, float]:
        """The step's values and those recorded since the last log step, in one host
        transfer (``backend.fetch``), with the run's counters."""
        lazy = output.lazy_values()
        lazy.update(self._pending)
        self._pending = {}
        metrics = backend.fetch(lazy)
        metrics.update(tokens=float(tokens), samples=float(samples), train_time_s=train_time_s)
        return metrics


def evaluate(backend: Backend, dispatch: Callable[..., None]) -> dict[str, float]:
    """The evaluation phase: its metrics go to ``on_eval_end``, the backend's own keys as
    ``eval/<key>``, names a user chose (``NamedMetrics``: ``val_loss``) as they are."""
    declared = backend.abilities()
    if not declared.evaluate:
        raise lacking(backend.name, declared, "evaluate")
    dispatch("on_eval_start")
    metrics = backend.fetch(evaluation_keys(backend.evaluate()))
    dispatch("on_eval_end", metrics)
    return metrics
