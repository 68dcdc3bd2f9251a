"""Where ``CompositeLogger`` sends metrics: one small module per destination.

A sink has ``open(driver)``, ``write(step, metrics, phase)`` and ``close()``;
``phase`` is ``"train"`` (a log step's metrics) or ``"eval"`` (an evaluation's). Sinks are
registered by name in ``SINKS`` so recipes and config files can say
``CompositeLogger(["jsonl", "tensorboard", "wandb", "console"])``.

Example::

    from baton.callbacks.sinks import SINKS, JsonlSink

    sink = SINKS.build("jsonl")        # or JsonlSink(path="metrics.jsonl")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from baton.core.registry import Registry

if TYPE_CHECKING:
    from baton.core import Driver

#: which phase a batch of metrics belongs to
Phase = Literal["train", "eval"]


@runtime_checkable
class Sink(Protocol):
    """A destination for logged metrics."""

    name: str

    def open(self, driver: Driver) -> None: ...

    def write(self, step: int, metrics: dict[str, float], phase: Phase = "train") -> None: ...

    def close(self) -> None: ...


SINKS: Registry[type] = Registry("log sink")
SINKS.add_lazy("jsonl", "baton.callbacks.sinks.jsonl:JsonlSink")
SINKS.add_lazy("tensorboard", "baton.callbacks.sinks.tensorboard:TensorBoardSink")
SINKS.add_lazy("wandb", "baton.callbacks.sinks.wandb:WandbSink")
SINKS.add_lazy("console", "baton.callbacks.sinks.console:ConsoleSink")

__all__ = ["SINKS", "Phase", "Sink"]
