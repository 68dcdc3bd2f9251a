"""A whole baton backend in one file: a plain PyTorch loop on one device.

It trains a small regression network with AdamW on a list of batches, and offers
evaluation, skipping data and the model-state view. Everything else (ranks, a resume's
changed settings, the checkpoint record's defaults) comes from ``BackendBase``::

    from baton.core import Driver
    from minimal_backend import MinimalBackend, regression_batches

    backend = MinimalBackend(regression_batches(64), eval_batches=regression_batches(4, seed=1))
    Driver(backend, max_steps=20, eval_every=10, run_dir="runs/minimal").fit()

``docs/writing-a-backend.md`` walks through it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from baton.backends.torch_model_state import TorchModelState
from baton.backends.torch_pieces import entries_from_parameters
from baton.core import LOAD_ALL, Abilities, BackendBase, CheckpointFacts, LoadPlan, StepOutput

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


class MinimalBackend(BackendBase):
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
        self.batches, self.eval_batches = batches, eval_batches
        self.device = torch.device(device)
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.position = 0  # batches read: the data position
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
    def device_type(self) -> str:
        return self.device.type

    # -- the run ------------------------------------------------------------------------
    def setup(self) -> None:
        torch.manual_seed(self.config["seed"])
        features = self.batches[0][0].shape[1]
        hidden = self.config["hidden"]
        model = nn.Sequential(
            nn.Linear(features, hidden), nn.Tanh(), nn.Dropout(0.1), nn.Linear(hidden, 1)
        )
        self.model = model.to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config["lr"])
        self.position, self._state = 0, None

    def _built(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        if self.model is None or self.optimizer is None:
            raise RuntimeError("call setup() first")
        return self.model, self.optimizer

    def train_step(self, step: int) -> StepOutput:
        model, optimizer = self._built()
        x, y = (t.to(self.device) for t in self.batches[self.position % len(self.batches)])
        self.position += 1
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if self._state is not None:
            self._state.before_clipping()  # frozen gradients dropped, watchers called
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return StepOutput(loss=loss.detach(), samples=x.shape[0])

    def teardown(self) -> None:
        self.model = self.optimizer = self._state = None

    # -- checkpoints --------------------------------------------------------------------
    def save(self, directory: Path, *, asynchronous: bool = False) -> None:
        model, optimizer = self._built()
        directory.mkdir(parents=True, exist_ok=True)
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "position": self.position,
            "rng": torch.get_rng_state(),
        }
        torch.save(state, directory / "state.pt")

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        model, optimizer = self._built()
        state = torch.load(directory / "state.pt", map_location=self.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if "data" not in plan.fresh:
            self.position = state["position"]
        if "rng" not in plan.fresh:
            torch.set_rng_state(state["rng"].cpu())

    def checkpoint_facts(self) -> CheckpointFacts:
        """No parallel layout; the data position in samples; which data it was."""
        samples = sum(x.shape[0] for x, _ in self._read(self.position))
        digest = hashlib.sha256()
        for x, y in self.batches:
            digest.update(x.numpy().tobytes() + y.numpy().tobytes())
        return CheckpointFacts(layout={}, samples=samples, data=digest.hexdigest()[:16])

    def _read(self, count: int) -> list[Batch]:
        return [self.batches[i % len(self.batches)] for i in range(count)]

    # -- the abilities it offers ----------------------------------------------------------
    def evaluate(self) -> Mapping[str, Any]:
        model, _ = self._built()
        model.eval()
        with torch.no_grad():
            losses = [
                nn.functional.mse_loss(model(x.to(self.device)), y.to(self.device))
                for x, y in self.eval_batches
            ]
        model.train()
        return {"loss": torch.stack(losses).mean()}

    def skip_data(self, steps: int) -> None:
        self.position += steps  # one batch per step

    def model_state(self) -> TorchModelState:
        model, optimizer = self._built()
        if self._state is None:
            self._state = TorchModelState(
                entries_from_parameters(model.named_parameters()),
                optimizers=[optimizer],
                fetch=self.fetch,
            )
        return self._state


if TYPE_CHECKING:  # the type checker reads this: the example satisfies the Backend protocol
    _conforms: Backend = MinimalBackend(regression_batches(1))
