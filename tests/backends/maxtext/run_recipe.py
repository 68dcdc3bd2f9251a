"""Run a recipe in this process with torch hidden, and write what happened as JSON.

    python run_recipe.py OUT.json RECIPE.py [recipe arguments ...]

``{rank}`` in OUT.json becomes the process's rank (``BATON_RANK``), for multi-process runs.

torch is installed in the development environment (other backends need it) and
MaxText's optional imports (tensorboardX, transformers) load it when they find it.
Hiding it from the import system reproduces a JAX-only install: ``import torch``
fails as if it were not installed. The JSON records every logged loss, the run's
result and whether any ``torch`` module was ever imported.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
from typing import Any


class _HideTorch(importlib.abc.MetaPathFinder):
    """Wraps a finder so that ``torch`` and its submodules are never found."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "torch" or name.startswith("torch."):
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find is not None else None

    def __getattr__(self, attr: str) -> Any:  # invalidate_caches, find_distributions, ...
        return getattr(self.inner, attr)


def hide_torch() -> None:
    sys.meta_path[:] = [_HideTorch(finder) for finder in sys.meta_path]


def main(out: str, recipe: str, *argv: str) -> None:
    hide_torch()
    from baton.core import Callback
    from baton.core.cli.recipe import build_driver

    class RecordLosses(Callback):
        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_log(self, driver: Any, metrics: dict[str, float]) -> None:
            if "loss" in metrics:
                self.losses[driver.step] = metrics["loss"]

    driver = build_driver(recipe, argv)
    recorder = RecordLosses()
    driver.callbacks.append(recorder)
    result = driver.fit()
    report = {
        "losses": recorder.losses,
        "step": result.step,
        "resumed_from": str(result.resumed_from) if result.resumed_from else None,
        "checkpoints": [str(p) for p in result.checkpoints],
        "torch_modules": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
        "jax_loaded": "jax" in sys.modules,
    }
    out = out.replace("{rank}", os.environ.get("BATON_RANK", "0"))
    report["rank"], report["world_size"] = driver.backend.rank, driver.backend.world_size
    with open(out, "w") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
