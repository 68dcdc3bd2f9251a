"""GradientNormMonitor: per-group gradient norms from backends with the ``model_state``
ability, refused up front by backends without it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.backends.lightning import LightningBackend
from baton.callbacks import GradientNormMonitor
from baton.core import Callback, Driver
from baton.core.abilities import MissingAbilityError
from support.scalar_backend import ScalarBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends" / "lightning"))

import lightning_corpus as corpus


class Logged(Callback):
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}

    def on_log(self, driver, metrics):
        self.metrics[driver.step] = dict(metrics)


def test_group_norms_match_the_clipping_norm_of_the_same_gradients(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = [(torch.randn(6, 4), torch.randn(6, 1)) for _ in range(4)]
    backend = FabricBackend(
        model=net,
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
        data=data,
        loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        config=FabricConfig(accelerator="cpu", grad_clip=1e9),  # reports the norm, clips nothing
    )
    logged = Logged()
    Driver(backend, [GradientNormMonitor(depth=1), logged], max_steps=4, log_every=2,
           run_dir=tmp_path).fit()  # fmt: skip
    assert sorted(logged.metrics) == [2, 4]
    for metrics in logged.metrics.values():
        groups = [metrics["grad_norm/0"], metrics["grad_norm/2"]]
        assert math.hypot(*groups) == pytest.approx(metrics["grad_norm/total"], rel=1e-6)
        assert metrics["grad_norm/total"] == pytest.approx(metrics["grad_norm"], rel=1e-5)


def test_a_lightning_module_shows_its_gradients(tmp_path):
    case = corpus.CASES["batchnorm"]
    backend = LightningBackend(
        case.module(), datamodule=case.data(), config=FabricConfig(accelerator="cpu")
    )
    logged = Logged()
    Driver(backend, [GradientNormMonitor(), logged], max_steps=2, log_every=1,
           run_dir=tmp_path).fit()  # fmt: skip
    assert logged.metrics[2]["grad_norm/net"] == logged.metrics[2]["grad_norm/total"] > 0


def test_a_backend_without_the_ability_is_refused_before_the_first_step(tmp_path):
    with pytest.raises(MissingAbilityError, match="GradientNormMonitor.*'model_state'"):
        Driver(ScalarBackend(), [GradientNormMonitor()], max_steps=2, run_dir=tmp_path).fit()
