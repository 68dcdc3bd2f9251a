"""The Fabric runtime and the parts both Fabric backends compose: the checkpoint I/O and
the model-state view work from what they are handed (no backend), and neither backend
inherits the other nor is imported by its parts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from baton.backends.fabric.checkpoint import FabricCheckpointIO
from baton.backends.fabric.config import FabricConfig
from baton.backends.fabric.model_state import FabricModelState
from baton.backends.fabric.runtime import FabricRuntime, TrainingParts
from baton.backends.fabric.stream import DataPosition, LoaderStream

BACKENDS = Path(__file__).parents[3] / "packages/backends/src/baton/backends"
#: modules handed their state by a backend, and the backend modules they must not import
PARTS = (
    "fabric/checkpoint.py",
    "fabric/model_state.py",
    "fabric/replay.py",
    "fabric/runtime.py",
    "lightning/checkpoint_io.py",
    "lightning/loop.py",
    "lightning/validation.py",
)


def test_checkpoint_io_restores_the_parts_and_position_it_is_handed(tmp_path):
    runtime = FabricRuntime()
    fabric = runtime.launch(FabricConfig(accelerator="cpu"))
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    model, optimizer = fabric.setup(net, torch.optim.AdamW(net.parameters(), lr=0.1))
    parts = TrainingParts(net, model, (optimizer,))
    position = DataPosition(LoaderStream([torch.ones(2, 3) * i for i in range(4)]))
    io = FabricCheckpointIO(runtime, lambda: parts, position)

    model(position.stream.next()).sum().backward()  # type: ignore[union-attr]
    optimizer.step()
    position.samples = 2
    io.save(tmp_path)
    saved = net.weight.detach().clone()
    saved_moment = optimizer.state[net.weight]["exp_avg"].clone()

    model(position.stream.next()).sum().backward()  # type: ignore[union-attr]
    optimizer.step()
    position.samples = 4
    io.load(tmp_path)

    assert torch.equal(net.weight, saved)
    assert torch.equal(optimizer.state[net.weight]["exp_avg"], saved_moment)
    assert position.samples == 2
    assert torch.equal(position.stream.next(), torch.ones(2, 3))  # type: ignore[union-attr]
    assert io.facts().samples == 2 and io.facts().layout["state"] == "whole"
    io.close()


def test_model_state_view_is_built_from_the_parts_and_rebuilt_for_new_ones():
    runtime = FabricRuntime()
    fabric = runtime.launch(FabricConfig(accelerator="cpu"))
    current: list[TrainingParts] = []

    def build() -> TrainingParts:
        net = nn.Sequential(nn.Linear(3, 2))
        model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        return TrainingParts(net, model, (optimizer,))

    state = FabricModelState(lambda: current[0] if current else None, lambda: 0, runtime.fetch)
    with pytest.raises(RuntimeError, match="after setup"):
        state.view()
    current.append(build())
    first = state.view()
    assert sorted(p.name for p in first.parameters()) == ["0.bias", "0.weight"]
    assert state.view() is first
    current[0] = build()
    assert state.view() is not first


def test_neither_backend_inherits_the_other_and_no_part_imports_a_backend():
    from baton.backends.fabric.backend import FabricBackend
    from baton.backends.lightning.backend import LightningBackend

    assert FabricBackend not in LightningBackend.__mro__
    assert LightningBackend not in FabricBackend.__mro__
    backend_modules = {"baton.backends.fabric.backend", "baton.backends.lightning.backend"}
    for name in PARTS:
        tree = ast.parse((BACKENDS / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & backend_modules, f"{name} imports its backend"
