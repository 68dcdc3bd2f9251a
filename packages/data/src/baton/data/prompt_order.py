"""The order prompts are read in for online RL: one seeded permutation per epoch,
resumable at any prompt.

Each step takes the next ``per_step`` prompts of the epoch's order; a tail shorter than a
step is left out of the epoch (as ``GlobalBatches`` does with its batches), and the next
epoch draws a new permutation from ``(seed, epoch)``. The position (epoch and prompts
read in it) is the whole state: a resumed run reads exactly the prompts the
uninterrupted run would have.

Example::

    from baton.data.prompt_order import PromptOrder

    order = PromptOrder(num_prompts=100, per_step=4, seed=0)
    order.next_step()             # four prompt indices of epoch 0's permutation
    state = order.state_dict()    # {"epoch": 0, "position": 4, "prompts": 100, "seed": 0, ...}
    again = PromptOrder(num_prompts=100, per_step=4, seed=0)
    again.load_state_dict(state)  # continues at prompt 4 of epoch 0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from baton.data.errors import DataError


class PromptOrder:
    """Prompt indices, ``per_step`` at a time, in one seeded order per epoch."""

    def __init__(self, *, num_prompts: int, per_step: int, seed: int, shuffle: bool = True) -> None:
        if per_step < 1:
            raise DataError(f"a step needs at least one prompt, not {per_step}")
        if num_prompts < per_step:
            raise DataError(
                f"the prompts hold {num_prompts} prompts, fewer than the {per_step} each step "
                "needs; give more prompts, or fewer rollouts per step"
            )
        self.num_prompts = num_prompts
        self.per_step = per_step
        self.seed = seed
        self.shuffle = shuffle
        #: epochs completed
        self.epoch = 0
        #: prompts of the current epoch's order already read
        self.position = 0
        self._order: np.ndarray | None = None

    def order(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order of the prompt indices (a permutation seeded by
        ``(seed, epoch)``, or ``0..n-1`` without shuffling)."""
        if not self.shuffle:
            return np.arange(self.num_prompts, dtype=np.int64)
        generator = np.random.Generator(np.random.PCG64([self.seed, epoch]))
        return generator.permutation(self.num_prompts).astype(np.int64)

    def next_step(self) -> list[int]:
        """The next step's prompt indices (the next epoch begins where this one cannot
        give a whole step)."""
        if self.position + self.per_step > self.num_prompts:
            self.epoch += 1
            self.position = 0
            self._order = None
        if self._order is None:
            self._order = self.order(self.epoch)
        start = self.position
        self.position += self.per_step
        return [int(i) for i in self._order[start : self.position]]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "prompts": self.num_prompts,
            "seed": self.seed,
            "per_step": self.per_step,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the saved position; the prompts, seed and prompts per step must be
        the ones the run was saved with."""
        saved = (int(state["prompts"]), int(state["seed"]), int(state["per_step"]))
        if saved != (self.num_prompts, self.seed, self.per_step):
            raise DataError(
                f"cannot continue the prompt order: the checkpoint read {saved[0]} prompts, "
                f"{saved[2]} per step, in the order of seed {saved[1]}; this run has "
                f"{self.num_prompts}, {self.per_step} per step, seed {self.seed}; resume with "
                "the prompts, seed and batch the run was saved with"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = None
