"""CorruptionCheck's step replay on one Fabric process: a replayed step matches itself
bitwise and leaves the run exactly as without the check (dropout, a shuffled loader
crossing epochs, accumulation, a schedule); a gradient perturbed in the replay only is
found, naming the rank and the parameter, and the run stops unsaved."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from baton.backends.fabric import FabricBackend, FabricConfig
from baton.callbacks import Checkpoint, CorruptionCheck
from baton.core import Callback, Driver
from baton.core.checkpoints import files as ckpt


class Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step_end(self, driver: Driver, output: Any) -> None:
        self.losses.append(float(output.loss))


class PerturbReplay(Callback):
    """Flip one bit of ``name``'s gradient in the second run of step ``at`` (the replay)."""

    def __init__(self, at: int, name: str) -> None:
        self.at, self.name, self.seen = at, name, 0

    def on_train_start(self, driver: Driver) -> None:
        driver.backend.model_state().watch_gradients(self.watch)

    def on_step_start(self, driver: Driver) -> None:
        self.seen = 0 if driver.step + 1 == self.at else -100

    def watch(self, grads: Any) -> None:
        self.seen += 1
        if self.seen == 2:
            grads[self.name].view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 22)


def backend(grad_clip: float | None) -> FabricBackend:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(12, 6), torch.randn(12, 1))
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 1))
    return FabricBackend(
        model=model,
        optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        data=DataLoader(data, batch_size=4, shuffle=True),
        loss_fn=lambda m, batch: nn.functional.mse_loss(m(batch[0]), batch[1]),
        config=FabricConfig(accelerator="cpu", grad_accum=2, grad_clip=grad_clip),
    )


def train(
    tmp_path, name: str, *extra: Callback, grad_clip: float | None = 1.0
) -> tuple[Driver, Losses]:
    losses = Losses()
    callbacks = [Checkpoint(every_n_steps=2, keep_last=None, save_on_stop=False), losses, *extra]
    driver = Driver(
        backend(grad_clip), callbacks, max_steps=7, log_every=7, run_dir=tmp_path / name
    )
    driver.fit()
    return driver, losses


def weights(driver: Driver) -> list[torch.Tensor]:
    model: Any = driver.backend
    return [p.detach().clone() for p in model.raw_model.parameters()]


def test_replay_matches_bitwise_and_leaves_the_run_unchanged(tmp_path):
    plain, plain_losses = train(tmp_path, "plain")
    check = CorruptionCheck(every_n_steps=3, replay_every_n_steps=2)
    checked, checked_losses = train(tmp_path, "checked", check)
    assert check.replayed == [2, 4, 6]
    assert check.findings == []
    assert checked_losses.losses == plain_losses.losses  # bitwise, every step
    for a, b in zip(weights(plain), weights(checked), strict=True):
        assert torch.equal(a, b)


def test_a_fault_in_the_replayed_computation_is_named_and_stops(tmp_path):
    check = CorruptionCheck(every_n_steps=100, replay_every_n_steps=2)
    perturb = PerturbReplay(at=4, name="0.weight")
    # no clipping: the gradients' norm would carry the fault to every parameter
    driver, _ = train(tmp_path, "perturbed", check, perturb, grad_clip=None)
    assert check.replayed == [2, 4]
    # the flipped gradient changes that parameter's weight and Adam's moments, no other
    assert {f["parameter"] for f in check.findings} == {"0.weight"}
    assert {f.get("state") for f in check.findings} == {None, "exp_avg", "exp_avg_sq"}
    assert {(f["step"], tuple(f["ranks"]), f["check"]) for f in check.findings} == {
        (4, (0,), "replay")
    }
    assert driver.step == 4
    saved = [p.name for p in ckpt.list_checkpoints(tmp_path / "perturbed" / "checkpoints")]
    assert saved == [ckpt.checkpoint_name(2)]  # step 4's state was never saved


def test_replay_needs_the_ability_and_a_positive_cadence():
    with pytest.raises(ValueError, match="replay_every_n_steps must be >= 1"):
        CorruptionCheck(replay_every_n_steps=0)
    assert "step_replay" in CorruptionCheck(replay_every_n_steps=5).requires()
    assert "step_replay" not in CorruptionCheck().requires()
