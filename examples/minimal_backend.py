"""A whole baton backend in one file: a plain PyTorch loop on one device.

It trains a small regression network with AdamW on a list of batches, and offers
evaluation, skipping data and the model-state view. It has the shape of the backends
baton ships: a step engine (``MinimalBackend``) that owns a runtime (``TorchDistributed``,
the torch backends' device, ranks and host transfers) and, built in ``setup``, its
checkpoint I/O (``MinimalCheckpointIO``), each handed the state it works on, never the
backend. ``UsesCheckpointIO`` and ``UsesTorchDistributed`` hand the backend's checkpoint
and rank methods over to them; the rest (a resume's changed settings, the record's
defaults) comes from ``BackendBase``::

    from baton.core import Driver
    from minimal_backend import MinimalBackend, regression_batches

    backend = MinimalBackend(regression_batches(64), eval_batches=regression_batches(4, seed=1))
    Driver(backend, max_steps=20, eval_every=10, run_dir="runs/minimal").fit()

``docs/writing-a-backend.md`` walks through it, and shows the descriptor its package
declares.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from baton.backends.torch_distributed import TorchDistributed, UsesTorchDistributed
from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import entries_from_parameters
from baton.core import (
    LOAD_ALL,
    Abilities,
    BackendBase,
    CheckpointFacts,
    LoadPlan,
    StepOutput,
    UsesCheckpointIO,
)

if TYPE_CHECKING:
    from baton.core import Backend

Batch = tuple[torch.Tensor, torch.Tensor]


def regression_batches(
    count: int, *, size: int = 4, features: int = 8, seed: int = 0
) -> list[Batch]:
    """``count`` batches of ``size`` inputs and the targets of a fixed random linear map."""
    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(features, 1, generator=torch.Generator().manual_seed(12345))
    inputs = [torch.randn(size, features, generator=generator) for _ in range(count)]
    return [(x, x @ truth) for x in inputs]


@dataclass
class TrainingParts:
    """What ``setup`` built: the model and its optimizer."""

    model: nn.Module
    optimizer: torch.optim.Optimizer


@dataclass
class DataPosition:
    """The batches read in order, and how many were read: the engine advances it, the
    checkpoint I/O saves and restores it."""

    batches: Sequence[Batch]
    read: int = 0

    def next(self) -> Batch:
        batch = self.batches[self.read % len(self.batches)]
        self.read += 1
        return batch

    def samples(self) -> int:
        """Samples read so far (the data position core records)."""
        return sum(self.batches[i % len(self.batches)][0].shape[0] for i in range(self.read))

    def fingerprint(self) -> str:
        """Which data it is: a resume on other data is refused."""
        digest = hashlib.sha256()
        for x, y in self.batches:
            digest.update(x.numpy().tobytes() + y.numpy().tobytes())
        return digest.hexdigest()[:16]


class MinimalCheckpointIO:
    """The minimal backend's checkpoints: the model, the optimizer, the data position and
    the random state in one ``state.pt``, and the facts core records."""

    def __init__(self, parts: TrainingParts, position: DataPosition, device: torch.device) -> None:
        self.parts, self.position, self.device = parts, position, device

    def save(self, directory: Path, *, asynchronous: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.parts.model.state_dict(),
            "optimizer": self.parts.optimizer.state_dict(),
            "position": self.position.read,
            "rng": torch.get_rng_state(),
        }
        torch.save(state, directory / "state.pt")

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        state = torch.load(directory / "state.pt", map_location=self.device, weights_only=True)
        self.parts.model.load_state_dict(state["model"])
        self.parts.optimizer.load_state_dict(state["optimizer"])
        if "data" not in plan.fresh:
            self.position.read = state["position"]
        if "rng" not in plan.fresh:
            torch.set_rng_state(state["rng"].cpu())

    def facts(self) -> CheckpointFacts:
        """No parallel layout; the data position in samples; which data it was."""
        return CheckpointFacts(
            layout={}, samples=self.position.samples(), data=self.position.fingerprint()
        )

    def plan_load(self, saved: Mapping[str, Any]) -> LoadPlan:
        return LOAD_ALL  # one device has one layout: everything loads

    def legacy_facts(self, directory: Path) -> CheckpointFacts | None:
        return None  # no checkpoint of this backend predates baton.json's record


class MinimalBackend(UsesCheckpointIO[MinimalCheckpointIO], UsesTorchDistributed, BackendBase):
    """A two-layer network (with dropout, so the random state matters) trained by AdamW
    on ``batches``, read in order from a position that checkpoints keep."""

    name = "minimal"
    distribution = "torch"

    def __init__(
        self,
        batches: Sequence[Batch],
        *,
        eval_batches: Sequence[Batch] = (),
        hidden: int = 16,
        lr: float = 0.01,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        self.config: dict[str, Any] = {"hidden": hidden, "lr": lr, "seed": seed}
        self.eval_batches = eval_batches
        #: the device, ranks and host transfers (one process: no group is created)
        self.runtime = TorchDistributed()
        self.runtime.device = torch.device(device)
        #: the batches and how many were read (the data position)
        self.position = DataPosition(batches)
        self.parts: TrainingParts | None = None
        self._state: TorchModelState | None = None

    # -- identity and abilities ---------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return dict(self.config)  # a resume with another model or rate is refused

    def abilities(self) -> Abilities:
        return Abilities(
            evaluate=bool(self.eval_batches), skip_data=True, model_state=True
        ).refusing(
            evaluate=None if self.eval_batches else "no evaluation data: pass eval_batches=...",
            multi_rank="one process on one device: use the fabric backend for several ranks",
        )

    @property
    def model(self) -> nn.Module | None:
        """The model ``setup`` built (``None`` before)."""
        return self.parts.model if self.parts is not None else None

    # -- the run ------------------------------------------------------------------------
    def setup(self) -> None:
        torch.manual_seed(self.config["seed"])
        features = self.position.batches[0][0].shape[1]
        hidden = self.config["hidden"]
        model = nn.Sequential(
            nn.Linear(features, hidden), nn.Tanh(), nn.Dropout(0.1), nn.Linear(hidden, 1)
        ).to(self.runtime.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.config["lr"])
        self.parts = TrainingParts(model, optimizer)
        self.position.read, self._state = 0, None
        self.checkpoints = MinimalCheckpointIO(self.parts, self.position, self.runtime.device)

    def _built(self) -> TrainingParts:
        if self.parts is None:
            raise RuntimeError("call setup() first")
        return self.parts

    def train_step(self, step: int) -> StepOutput:
        parts = self._built()
        model, optimizer = parts.model, parts.optimizer
        x, y = (t.to(self.runtime.device) for t in self.position.next())
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if self._state is not None:
            self._state.before_clipping()  # frozen gradients dropped, watchers called
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return StepOutput(loss=loss.detach(), samples=x.shape[0])

    def teardown(self) -> None:
        self.parts = self._state = None

    # -- the abilities it offers ----------------------------------------------------------
    def evaluate(self) -> Mapping[str, Any]:
        model, device = self._built().model, self.runtime.device
        model.eval()
        with torch.no_grad():
            losses = [
                nn.functional.mse_loss(model(x.to(device)), y.to(device))
                for x, y in self.eval_batches
            ]
        model.train()
        return {"loss": torch.stack(losses).mean()}

    def skip_data(self, steps: int) -> None:
        self.position.read += steps  # one batch per step

    def model_state(self) -> TorchModelState:
        parts = self._built()
        if self._state is None:
            self._state = TorchModelState(
                entries_from_parameters(parts.model.named_parameters()),
                optimizers=[parts.optimizer],
                fetch=self.fetch,
            )
        return self._state


if TYPE_CHECKING:  # the type checker reads this: the example satisfies the Backend protocol
    _conforms: Backend = MinimalBackend(regression_batches(1))
