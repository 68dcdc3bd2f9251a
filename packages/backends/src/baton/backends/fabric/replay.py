"""Step replay for the Fabric backend (ability ``step_replay``): one optimizer step run
twice from the same state, the two results compared bitwise; and
``FabricCorruptionChecks``, the object ``FabricBackend`` owns for this ability and
``weight_checksums``.

Example (what ``FabricBackend.train_step`` does once ``replay_next_step()`` armed it)::

    replay = StepReplay()
    output = replay.run(run_step, model, optimizer, schedulers, scaler, device)
    # run_step(): the step, drawing its batches through replay.draw
    replay.mismatches                        # names whose checksums differ: [] if healthy

Before the first run the snapshot takes the weights and buffers, the optimizer's state
and hyper-parameters, the schedulers', a gradient scaler's and the random state. The
first run draws its batches from the data as usual; each batch is kept (a copy) with
the random state right after it was drawn. Then the checksums of weights and optimizer
state are taken, the snapshot restored, and the second run reads the kept batches,
each with its random state, so the data does not advance twice and the computation is
the same. The second run's result stands: a healthy replay changes nothing. Its cost is
one more step and a copy of the training state in device memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_map

from baton.backends.fabric.build import is_sharded
from baton.backends.fabric.checkpoint import restore_rng_state, rng_state
from baton.backends.fabric.runtime import FabricRuntime, TrainingParts
from baton.backends.weight_checksums import gather, gather_weight_checksums, state_checksums

T = TypeVar("T")


class Snapshot:
    """The training state before a step, restorable in place (the same tensors: the
    optimizer and DDP keep pointing at them)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedulers: list[Any],
        scaler: Any,
        device: torch.device,
    ) -> None:
        self.model, self.optimizer, self.schedulers, self.scaler = (
            model,
            optimizer,
            schedulers,
            scaler,
        )
        self.device = device
        with torch.no_grad():
            self.tensors = [t.detach().clone() for t in self._tensors()]
        self.optimizer_state = {
            param: {
                k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                for k, v in state.items()
            }
            for param, state in optimizer.state.items()
        }
        self.groups = [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups
        ]
        self.scheduler_states = [copy.deepcopy(s.state_dict()) for s in schedulers]
        self.scaler_state = copy.deepcopy(scaler.state_dict()) if scaler is not None else None
        self.rng = rng_state(device)

    def _tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    def restore(self) -> None:
        with torch.no_grad():
            for live, kept in zip(self._tensors(), self.tensors, strict=True):
                live.copy_(kept)
        self.optimizer.state.clear()
        self.optimizer.state.update(self.optimizer_state)  # used once: no copy needed
        for group, kept in zip(self.optimizer.param_groups, self.groups, strict=True):
            group.update(kept)
        for scheduler, state in zip(self.schedulers, self.scheduler_states, strict=True):
            scheduler.load_state_dict(state)
        if self.scaler is not None:
            self.scaler.load_state_dict(self.scaler_state)
        restore_rng_state(self.rng, self.device)


def _copy(batch: Any) -> Any:
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, batch)


class StepReplay:
    """Runs a step twice and records what differs (``mismatches``)."""

    def __init__(self) -> None:
        #: the next ``train_step`` is replayed
        self.armed = False
        #: names whose checksums differed between the two runs of the last replayed step
        self.mismatches: list[str] = []
        self._kept: list[tuple[Any, dict[str, Any]]] = []
        #: which run of a replayed step is going on: 0 (none), 1 or 2
        self._run = 0
        self._device = torch.device("cpu")

    def draw(self, draw_batch: Callable[[], Any]) -> Any:
        """The next batch: ``draw_batch()`` outside a replay; drawn and kept in the first
        run of a replayed step, the kept one (and its random state) in the second."""
        if self._run == 2:
            batch, rng = self._kept.pop(0)
            restore_rng_state(rng, self._device)
            return batch
        batch = draw_batch()
        if self._run == 1:
            self._kept.append((_copy(batch), rng_state(self._device)))
        return batch

    def run(
        self,
        run_step: Callable[[], Any],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedulers: list[Any],
        scaler: Any,
        device: torch.device,
    ) -> Any:
        """``run_step()`` twice from the same state; the second result is returned."""
        self.armed, self._device, self._kept = False, device, []
        snapshot = Snapshot(model, optimizer, schedulers, scaler, device)
        try:
            self._run = 1
            run_step()
            first = state_checksums(model, optimizer)
            snapshot.restore()
            self._run = 2
            output = run_step()
        finally:
            self._run, self._kept = 0, []
        second = state_checksums(model, optimizer)
        self.mismatches = sorted(
            n for n in first.keys() | second.keys() if first.get(n) != second.get(n)
        )
        return output


class FabricCorruptionChecks:
    """The ``weight_checksums`` and ``step_replay`` abilities of one Fabric run, owned by
    its backend (``FabricBackend.corruption``, built after ``setup``): the backend's
    ability methods delegate here, its ``train_step`` runs each step through
    ``run_step`` and draws each batch through ``draw``.

    Args:
        fabric: the run's ``Fabric`` (strategy, ranks, the gradient scaler).
        model: the unwrapped model whose weights are checked.
        optimizer: its optimizer (the state checked and restored with the weights).
        schedulers: ``schedulers()``, the learning-rate schedulers a replay restores.
        wait_for_staging: blocks until an asynchronous save has copied the weights.

    Example (``FabricCorruptionChecks.of(runtime, parts, io.wait_for_staging)`` the same)::

        checks = FabricCorruptionChecks(fabric, model, optimizer,
                                        schedulers=lambda: [scheduler],
                                        wait_for_staging=io.wait_for_staging)
        checks.replay_next_step()               # arm: the next step runs twice
        output = checks.run_step(step)          # step() draws via checks.draw(next_batch)
        checks.gather_replay_mismatches()       # [[], []]: every rank healthy
    """

    def __init__(
        self,
        fabric: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        schedulers: Callable[[], list[Any]],
        wait_for_staging: Callable[[], None],
    ) -> None:
        self.fabric, self.model, self.optimizer = fabric, model, optimizer
        self.schedulers = schedulers
        self.wait_for_staging = wait_for_staging
        self.replay = StepReplay()
        #: optimizer steps this process has run through ``run_step``
        self.steps_run = 0

    @classmethod
    def of(
        cls, runtime: FabricRuntime, parts: TrainingParts, wait_for_staging: Callable[[], None]
    ) -> FabricCorruptionChecks:
        """The checks of the run ``runtime`` launched and ``parts`` records."""
        return cls(
            runtime.fabric,
            parts.raw_model,
            parts.optimizer,
            schedulers=lambda: list(parts.schedulers),
            wait_for_staging=wait_for_staging,
        )

    @property
    def sharded(self) -> bool:
        return is_sharded(self.fabric)

    def run_step(self, step: Callable[[], T]) -> T:
        """``step()``, twice from the same state when a replay is armed."""
        self.steps_run += 1
        if not self.replay.armed:
            return step()
        self.wait_for_staging()  # the replay restores weights an async save may be copying
        scaler = getattr(getattr(self.fabric.strategy, "precision", None), "scaler", None)
        return self.replay.run(
            step, self.model, self.optimizer, self.schedulers(), scaler, self.fabric.device
        )

    def draw(self, draw_batch: Callable[[], Any]) -> Any:
        """The step's next batch (``StepReplay.draw``: the kept one in a replay's second run)."""
        return self.replay.draw(draw_batch)

    def gather_weight_checksums(self) -> list[dict[str, str]]:
        """Every rank's checksums of parameters and optimizer state (ability
        ``weight_checksums``); replicated (DDP, single-device) models only."""
        return gather_weight_checksums(self.model, self.optimizer, sharded=self.sharded)

    def refusals(self) -> dict[str, str]:
        """Under a sharded strategy (FSDP) no rank holds a replica of a whole tensor:
        ``{ability: why}`` for ``Abilities.refusing``."""
        if not self.sharded:
            return {}
        why = "this strategy shards every parameter: no rank holds a whole replica to "
        return {
            "weight_checksums": why + "compare; use strategy='ddp' to check replicas",
            "step_replay": why + "checksum; use strategy='ddp' to replay steps",
        }

    def replay_next_step(self) -> bool:
        """Replay the next step (``False``, not yet: under DDP the first step of a process
        is not replayed, since DDP regroups its gradient buckets after it and so may
        round the gradients' reduction differently in the second run)."""
        if self.steps_run == 0 and self.fabric.world_size > 1:
            return False
        self.replay.armed = True
        return True

    def gather_replay_mismatches(self) -> list[list[str]]:
        """Every rank's mismatches of the last replayed step, indexed by rank (a collective)."""
        return [list(entry or []) for entry in gather(self.replay.mismatches)]
