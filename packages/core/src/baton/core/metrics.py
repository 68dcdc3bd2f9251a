"""What a backend's step returns, and the single host transfer on log steps.

A ``StepOutput`` holds backend arrays (torch tensors, jax arrays) untouched; nothing
in the driver reads them on a step that does not log. On a log step the driver hands
every pending value to ``backend.fetch`` at once, which moves them to the host in one
transfer and returns floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepOutput:
    """One optimizer step's results, lazily held.

    ``loss`` and ``metrics`` values may be device arrays; ``tokens`` and ``samples``
    are host integers (the backend knows its batch shape without a sync).
    """

    loss: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    samples: int = 0

    def lazy_values(self) -> dict[str, Any]:
        values = dict(self.metrics)
        if self.loss is not None:
            values["loss"] = self.loss
        return values


def to_float(value: Any) -> float:
    """Convert one host value (python number, numpy scalar, 0-d array) to ``float``."""
    if hasattr(value, "item"):
        return float(value.item())
    return float(value)
