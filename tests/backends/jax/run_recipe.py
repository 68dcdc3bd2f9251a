"""Run a recipe in this (fresh) process and write what happened as JSON.

    python run_recipe.py OUT.json RECIPE.py [recipe arguments ...]

``{rank}`` in OUT is replaced by this process's rank (``BATON_RANK``), so that several
processes of one job write one report each. The report holds every logged loss and
token count, the run's result and which ``torch`` modules were imported (the JAX
backend must import none: torch is installed here, so any import would show).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(out: str, recipe: str, *argv: str) -> None:
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    class Record(Callback):
        def __init__(self) -> None:
            self.losses: dict[int, float] = {}
            self.tokens: dict[int, float] = {}

        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                self.losses[driver.step] = metrics["loss"]
                self.tokens[driver.step] = metrics["tokens"]

    driver = build_driver(recipe, argv)
    record = Record()
    driver.callbacks.append(record)
    result = driver.fit()
    report = {
        "rank": driver.backend.rank,
        "world_size": driver.backend.world_size,
        "losses": record.losses,
        "tokens": record.tokens,
        "step": result.step,
        "resumed_from": str(result.resumed_from) if result.resumed_from else None,
        "checkpoints": [str(p) for p in result.checkpoints],
        "torch_modules": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
        "jax_loaded": "jax" in sys.modules,
    }
    with open(out.replace("{rank}", os.environ.get("BATON_RANK", "0")), "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
