"""Callbacks tests use to see what a run logged."""

from __future__ import annotations

from typing import Any

from baton.core import Callback


class Losses(Callback):
    """Keeps the training loss of every log step: ``values[step] = loss``."""

    def __init__(self) -> None:
        self.values: dict[int, float] = {}

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        if "loss" in metrics:
            self.values[driver.step] = metrics["loss"]
