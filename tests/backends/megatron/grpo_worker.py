"""Run a GRPO recipe (under torchrun, or in the test's process) and keep what its tests
compare: rank 0's logged metrics of every step and, at the end of training, the weights
``gather_weights`` puts together on global rank 0 (every rank takes part):
``torchrun ... grpo_worker.py OUT RECIPE ARGS...`` writes ``OUT/metrics.json`` and
``OUT/gathered.safetensors``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from baton.core import Callback
from baton.core.cli.recipe import build_driver

METRICS, GATHERED = "metrics.json", "gathered.safetensors"


class GRPOOutputs(Callback):
    """Rank 0 writes ``{step: metrics}`` after every log step and the gathered weights
    after the last step, into ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.metrics: dict[int, dict[str, float]] = {}

    def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
        self.metrics[driver.step] = dict(metrics)
        if driver.backend.rank == 0:
            (self.out / METRICS).write_text(json.dumps(self.metrics))

    def on_train_end(self, driver: Any) -> None:
        from safetensors.torch import save_file

        weights = driver.backend.gather_weights()  # a collective: every rank calls it
        if driver.backend.rank == 0:
            assert weights is not None, "gather_weights gives the weights on rank 0"
            save_file(dict(weights), str(self.out / GATHERED))
        else:
            assert weights is None, "gather_weights gives None off rank 0"


def run(out: Path, recipe: str, argv: list[str]) -> GRPOOutputs:
    out.mkdir(parents=True, exist_ok=True)
    driver = build_driver(recipe, argv)
    assert driver is not None
    outputs = GRPOOutputs(out)
    driver.callbacks.append(outputs)
    driver.fit()
    return outputs


if __name__ == "__main__":
    # the fixtures' reward file imports ``support`` (tests/), as the test process has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
