"""Run a recipe under torchrun with an objective registered from a file first, and keep
rank 0's logged metrics of every step:
``torchrun ... objective_worker.py METRICS.json FILE.py:NAME RECIPE ARGS...``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from posttrain_worker import Logged

from baton.core.cli.recipe import build_driver
from baton.core.objectives import register_objective

if __name__ == "__main__":
    path, _, name = sys.argv[2].rpartition(":")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register_objective(getattr(module, name))
    driver = build_driver(sys.argv[3], sys.argv[4:])
    assert driver is not None
    driver.callbacks.append(Logged(Path(sys.argv[1])))
    driver.fit()
