"""Every objective a backend declares runs on it (``BackendDescriptor.objectives``, read
for every declared backend: the six and any a plugin declares): ``STEPS`` real steps
from the recipe on the fixtures' data for the objective (``objective_runs``), each
logging a finite loss and every key the objective declares (its loss's metrics, its
step's own, its console keys).

Each case builds a real model and runs its framework's step (seconds to a minute on a
CPU): they are ``slow``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from baton.core.backend_descriptor import backend_descriptors
from baton.core.objectives import objective_named
from conformance.objective_runs import STEPS, declared_keys, objective_files, objective_run

CASES = [
    pytest.param(d.name, objective, id=f"{d.name}-{objective}", marks=pytest.mark.slow)
    for d in backend_descriptors()
    for objective in d.objectives
]


@pytest.fixture(scope="module")
def files(grpo_assets: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return objective_files(grpo_assets["files"], tmp_path_factory.mktemp("objective-data"))


@pytest.mark.parametrize(("backend", "objective"), CASES)
def test_each_declared_objective_runs_and_logs_its_keys(
    backend: str, objective: str, files: dict[str, Path], tmp_path: Path
) -> None:
    started = time.perf_counter()
    logged = objective_run(backend, objective, tmp_path / "run", files)
    print(f"{backend} {objective}: {STEPS} steps in {time.perf_counter() - started:.1f} s")
    assert sorted(logged.metrics) == list(range(1, STEPS + 1)), logged.logged
    keys = declared_keys(objective_named(objective))
    for step, metrics in logged.metrics.items():
        missing = [key for key in keys if key not in metrics]
        assert not missing, (step, missing, sorted(metrics))
        assert math.isfinite(metrics["loss"]), (step, metrics["loss"])
