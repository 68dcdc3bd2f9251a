"""MaxText on a mesh of 4 simulated CPU devices (fsdp, tensor and data axes) under baton.

``mesh_run.py`` runs in a fresh process (the device count is fixed when JAX starts):

* baton with fsdp 2 x tensor 2 gives the same per-step losses as MaxText's own
  ``train_loop`` on the same mesh and batches, bit for bit;
* the step-3 checkpoint restored onto data 2 x fsdp 2 (orbax reshards) equals, leaf by
  leaf on the host, the same checkpoint restored onto the saving mesh, and training
  continues there; its losses differ from the fsdp x tensor run only by the order of the
  reductions (measured: below 1e-3);
* a layout orbax cannot map (``scan_layers`` changed) is refused naming both layouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def mesh_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("mesh")
    out = work / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env |= {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(HERE / "mesh_run.py"), str(out), str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_fsdp_by_tensor_mesh_equals_maxtext_train_loop(mesh_report: dict[str, Any]) -> None:
    assert mesh_report["saved_layout"]["mesh"] == {"fsdp": 2, "tensor": 2}
    assert mesh_report["saved_layout"]["devices"] == 4
    losses = mesh_report["losses"]
    assert sorted(losses, key=int) == [str(s) for s in range(1, 7)]
    assert losses == mesh_report["reference"]  # bit for bit
    assert losses["6"] < losses["1"] - 1.0


def test_restore_onto_another_mesh_reshards_the_state(mesh_report: dict[str, Any]) -> None:
    assert mesh_report["other_layout"]["mesh"] == {"data": 2, "fsdp": 2}
    assert mesh_report["state_equal"] and mesh_report["leaves"] > 10
    continued, original = mesh_report["other_losses"], mesh_report["losses"]
    assert sorted(continued, key=int) == ["4", "5", "6"]
    for step, loss in continued.items():  # the same model, another reduction order
        assert abs(loss - original[step]) < 1e-3, (step, loss, original[step])


def test_layout_orbax_cannot_map_is_refused_naming_both(mesh_report: dict[str, Any]) -> None:
    message = mesh_report["refused"]
    assert "layout: checkpoint has" in message and "orbax cannot map" in message
    assert "scan_layers=False; this run has" in message and "scan_layers=True" in message


def test_plan_refuses_a_layout_that_does_not_fit(mesh_report: dict[str, Any]) -> None:
    message = mesh_report["misfit"]
    assert "'ici_fsdp_parallelism': 3" in message and "does not fit 4 devices" in message
