"""The goodput ledger's ``data_waiting``: a Fabric run whose ``DataLoader`` reads from a
dataset that sleeps in ``__getitem__`` attributes at least that sleep to waiting for
data (not to productive steps), and the categories still tile the wall time."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.callbacks import Goodput
from baton.callbacks.goodput_ledger import read_ledger, summarise
from baton.core import Callback, Driver
from baton.core.callback import METRIC_PRIORITY
from baton.tools.goodput import main as goodput_main

SLEEP_S = 0.01
BATCH = 2
STEPS = 12


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Regression samples that each take ``SLEEP_S`` to read (a slow disk, a busy
    tokenizer)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SLEEP_S)
        x = torch.full((4,), float(index % 7))
        return x, x.sum(dim=0, keepdim=True)


class RunningGoodput(Callback):
    """The ``goodput`` each log step got (after ``Goodput`` added it)."""

    priority = METRIC_PRIORITY + 1

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_log(self, driver: Driver, metrics: dict[str, float]) -> None:
        self.values.append(metrics["goodput"])


def test_a_slow_data_loader_is_counted_as_data_waiting(tmp_path, capsys):
    torch.manual_seed(0)
    backend = FabricBackend(
        model=nn.Linear(4, 1),
        optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=1e-3),
        data=DataLoader(SlowDataset(), batch_size=BATCH),
        loss_fn=lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
        config=FabricConfig(accelerator="cpu"),
    )
    running = RunningGoodput()
    driver = Driver(
        backend,
        [Goodput(interval_s=0), running],
        max_steps=STEPS,
        log_every=4,
        run_dir=tmp_path / "run",
    )
    driver.fit()

    summary = summarise(read_ledger(tmp_path / "run"))
    seconds = summary.seconds
    # every step after the first (that one is start-up) slept BATCH x SLEEP_S in the loader
    injected = (STEPS - 1) * BATCH * SLEEP_S
    assert seconds["data_waiting"] >= injected, seconds
    assert summary.steps == {"new": STEPS, "redone": 0}
    assert sum(seconds.values()) == pytest.approx(summary.wall_s, rel=0.01)
    # the running metric counts productive time only: never more than the time not
    # spent waiting for data
    assert running.values and all(0 < v < 1 for v in running.values)

    assert goodput_main([str(tmp_path / "run"), "--out", str(tmp_path / "plots")]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("data_waiting"))
    assert float(row.split()[1]) >= injected
