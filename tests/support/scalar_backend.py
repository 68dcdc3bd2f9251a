"""A tiny pure-Python backend for the driver's own tests: gradient descent on
f(w) = (w - target)^2 with a deterministic "data" stream of targets.

It is a real backend (state, step, evaluate, save/load to JSON files) with no
framework behind it, so the loop's behaviour can be tested in milliseconds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baton.core import LOAD_ALL, Abilities, BackendBase, LoadPlan, StepOutput

if TYPE_CHECKING:
    from baton.core import Backend


class ScalarBackend(BackendBase):
    name = "scalar"

    def __init__(
        self, lr: float = 0.1, seed: int = 0, fail_at: int | None = None, version: str = "1.0"
    ) -> None:
        self.config: dict[str, Any] = {"lr": lr, "seed": seed}
        self.fail_at = fail_at
        self._version = version
        self.events: list[str] = []
        self.w = 0.0
        self.rng = random.Random(seed)

    @property
    def version(self) -> str:
        return self._version

    def abilities(self) -> Abilities:
        return Abilities(evaluate=True)

    @property
    def changeable_settings(self) -> frozenset[str]:
        """The learning rate lives in ``config``, which no checkpoint restores."""
        return frozenset({"lr"})

    def setup(self) -> None:
        self.events.append("setup")
        self.rng = random.Random(self.config["seed"])
        self.w = 0.0

    def train_step(self, step: int) -> StepOutput:
        if self.fail_at is not None and step == self.fail_at:
            raise RuntimeError(f"step {step} failed")
        target = 3.0 + self.rng.uniform(-0.1, 0.1)
        loss = (self.w - target) ** 2
        self.w -= self.config["lr"] * 2 * (self.w - target)
        return StepOutput(loss=loss, metrics={"w": self.w}, tokens=8, samples=2)

    def evaluate(self) -> dict[str, float]:
        return {"loss": (self.w - 3.0) ** 2}

    def save(self, directory: Path, *, asynchronous: bool = False) -> None:
        (Path(directory) / "state.json").write_text(
            json.dumps({"w": self.w, "rng": self.rng.getstate()[1], "v": self.rng.getstate()[0]})
        )

    def load(self, directory: Path, plan: LoadPlan = LOAD_ALL) -> None:
        state = json.loads((Path(directory) / "state.json").read_text())
        self.w = state["w"]
        self.rng.setstate((state["v"], tuple(state["rng"]), None))

    def apply_changed_settings(self, changes: Mapping[str, tuple[Any, Any]]) -> set[str]:
        """A changed ``lr`` is already the one ``train_step`` reads (``load`` keeps it)."""
        return {"lr"} & set(changes)

    def describe(self) -> dict[str, Any]:
        return {"lr": self.config["lr"]}

    def teardown(self) -> None:
        self.events.append("teardown")


if TYPE_CHECKING:
    # the type checker in CI reads this file: the support backend satisfies the protocol
    _conforms: Backend = ScalarBackend()
