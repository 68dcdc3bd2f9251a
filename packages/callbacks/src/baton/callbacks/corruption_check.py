"""CorruptionCheck: every N steps, compare the weights of the data-parallel replicas.

Example::

    from baton.callbacks import Checkpoint, CorruptionCheck

    Driver(backend, [Checkpoint(every_n_steps=100), CorruptionCheck(every_n_steps=50,
                                                                     action="rollback")],
           run_dir="runs/x")

Under data parallelism every rank holds the same weights after each step; a bit that
flips in one rank's memory (silent data corruption) breaks that without any error. At
each check every rank computes a bitwise checksum of each parameter on its device and
the checksums are gathered (the backend's ``weight_checksums`` ability: one small
all-gather). A parameter on which a rank disagrees with the majority names that rank
(with two replicas there is no majority: both are named). The state is then never
saved (``control.veto_save``) and, per ``action``, the run stops (``"stop"``) or goes
back (``driver.rollback``) to the newest checkpoint at or before the last step that
checked clean and trains on from there (``"rollback"``; stops if there is none).
Every rank sees the same gathered checksums, so every rank decides alike.

Metric keys logged: none (each finding is logged and kept in ``findings``).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from baton.core import checkpointing as ckpt
from baton.core.backend import ChecksumsWeights
from baton.core.callback import GUARD_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import Driver, StepOutput
    from baton.core.backend import Ability

log = logging.getLogger("baton")


def disagreements(per_rank: list[dict[str, str]]) -> list[tuple[str, list[int]]]:
    """``[(parameter, ranks that differ from the majority)]`` for every parameter the
    ranks do not hold alike; without a majority every rank is named.

    >>> disagreements([{"w": "a"}, {"w": "a"}, {"w": "b"}])
    [('w', [2])]
    """
    found: list[tuple[str, list[int]]] = []
    for name in sorted({n for entry in per_rank for n in entry}):
        values = [entry.get(name) for entry in per_rank]
        if len(set(values)) == 1:
            continue
        (common, count), *_ = Counter(values).most_common()
        if count * 2 > len(values):
            found.append((name, [r for r, v in enumerate(values) if v != common]))
        else:
            found.append((name, list(range(len(values)))))
    return found


@CALLBACKS.register("corruption_check")
class CorruptionCheck(Callback):
    """Compare data-parallel replicas' weights bitwise; stop or roll back on a mismatch."""

    priority = GUARD_PRIORITY

    def __init__(
        self, every_n_steps: int = 100, action: Literal["stop", "rollback"] = "stop"
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if action not in ("stop", "rollback"):
            raise ValueError(f"action must be 'stop' or 'rollback', got {action!r}")
        self.every_n_steps = every_n_steps
        self.action = action
        #: each mismatch found: step, parameter, ranks
        self.findings: list[dict[str, Any]] = []
        self.last_good_step = 0
        self._rollback_to: Path | None = None

    def requires(self) -> frozenset[Ability]:
        return frozenset({"weight_checksums"})

    def on_train_start(self, driver: Driver) -> None:
        self.last_good_step = driver.step  # a resumed state was checked when saved

    def on_step_start(self, driver: Driver) -> None:
        if self._rollback_to is not None:
            path, self._rollback_to = self._rollback_to, None
            driver.rollback(path)
            log.warning("CorruptionCheck: rolled back to step %d", driver.step)

    def on_step_end(self, driver: Driver, output: StepOutput) -> None:
        if driver.step % self.every_n_steps:
            return
        backend = driver.backend
        assert isinstance(backend, ChecksumsWeights)  # requires() made the driver check
        found = disagreements(backend.gather_weight_checksums())
        if not found:
            self.last_good_step = driver.step
            return
        for name, ranks in found:
            self.findings.append({"step": driver.step, "parameter": name, "ranks": ranks})
        shown = "; ".join(f"{name} on rank(s) {', '.join(map(str, r))}" for name, r in found[:5])
        what = f"replicas' weights differ at step {driver.step}: {shown}"
        if len(found) > 5:
            what += f" (and {len(found) - 5} more parameters)"
        driver.control.veto_save(what)
        good = self._good_checkpoint(driver)
        if self.action == "rollback" and good is not None:
            log.error("CorruptionCheck: %s; rolling back to %s", what, good)
            self._rollback_to = good
            return
        hint = " (no checkpoint to roll back to)" if self.action == "rollback" else ""
        log.error("CorruptionCheck: %s; stopping%s", what, hint)
        driver.control.request_stop(f"silent corruption: {what}", all_ranks=True)

    def _good_checkpoint(self, driver: Driver) -> Path | None:
        for path, meta in ckpt.resumable(driver.checkpoint_dir):
            if int(meta["step"]) <= self.last_good_step:
                return path
        return None
