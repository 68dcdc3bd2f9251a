"""Run a recipe under torchrun and keep rank 0's logged metrics of every step:
``torchrun ... posttrain_worker.py METRICS.json RECIPE ARGS...``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver


class Logged(Callback):
    """Rank 0 writes ``{step: metrics}`` to ``path`` after every log step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metrics: dict[int, dict[str, float]] = {}

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.metrics[driver.step] = dict(metrics)
        if driver.backend.rank == 0:
            self.path.write_text(json.dumps(self.metrics))


if __name__ == "__main__":
    driver = build_driver(sys.argv[2], sys.argv[3:])
    driver.callbacks.append(Logged(Path(sys.argv[1])))
    driver.fit()
