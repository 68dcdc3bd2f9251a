"""A rank of a multi-rank TorchTitan post-training run (``test_torchtitan_posttrain_ranks``):
the debug recipe for one step with the arguments given, each rank writing the metrics of
its first step to ``OUT/rank<r>.json``.

    torchrun --nproc-per-node 2 posttrain_worker.py OUT --objective sft --dp-shard 2 ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

RECIPE = Path(__file__).parents[3] / "recipes" / "torchtitan_llama3_debug.py"


class FirstStep(Callback):
    """The metrics of the first log step."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        if not self.metrics:
            self.metrics = dict(metrics)


def main(out: Path, argv: list[str]) -> None:
    first = FirstStep()
    driver = build_driver(RECIPE, argv)
    driver.callbacks.append(first)
    driver.fit()
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(first.metrics))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
