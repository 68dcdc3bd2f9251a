"""CorruptionCheck: every N steps, compare the weights and optimizer state of the
data-parallel replicas; every M steps, replay a step and compare it with itself.

Example::

    from baton.callbacks import Checkpoint, CorruptionCheck

    Driver(backend, [Checkpoint(every_n_steps=100),
                     CorruptionCheck(every_n_steps=50, replay_every_n_steps=500,
                                     action="rollback")],
           run_dir="runs/x")

Under data parallelism every rank holds the same weights (and, unless the optimizer is
sharded, the same optimizer state) after each step; a bit that flips in one rank's
memory (silent data corruption) breaks that without any error. At each check every rank
computes a bitwise checksum of each parameter and each replicated optimizer state
tensor on its device and the checksums are gathered (the backend's ``weight_checksums``
ability: one small all-gather). A tensor on which a rank disagrees with the majority
names that rank (with two replicas there is no majority: both are named).

A fault in the computation itself (a unit that sometimes computes wrong) need not leave
replicas apart. With ``replay_every_n_steps`` the backend runs such a step twice from
the same state on the same batches (ability ``step_replay``) and compares the two
results bitwise on each rank: a healthy step is deterministic, so any difference names
that rank and the tensors. On a GPU that needs deterministic kernels
(``torch.use_deterministic_algorithms(True)``): atomic adds would differ run to run. The replayed step's second run is the one kept, so the check
changes nothing in a healthy run; it costs one more step each time.

On a finding the state is never saved (``control.veto_save``) and, per ``action``, the
run stops (``"stop"``) or goes back (``driver.rollback``) to the newest checkpoint at or
before the last step that checked clean and trains on from there (``"rollback"``; stops
if there is none). Every rank sees the same gathered results, so every rank decides alike.

Each finding (logged, and kept in ``findings``) has the ``step``, the ``parameter``, the
``ranks`` and, for optimizer state, its ``state`` (``exp_avg``...); a replay's has
``check: "replay"``. Metric keys logged: none.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from baton.callbacks.rollback import LastGood
from baton.core.callback import GUARD_PRIORITY, Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput
    from baton.core.abilities import Ability

log = logging.getLogger("baton")


def disagreements(per_rank: list[dict[str, str]]) -> list[tuple[str, list[int]]]:
    """``[(name, ranks that differ from the majority)]`` for every name the ranks holding
    it do not hold alike; without a majority every one of those ranks is named.

    >>> disagreements([{"w": "a"}, {"w": "a"}, {"w": "b"}])
    [('w', [2])]
    """
    found: list[tuple[str, list[int]]] = []
    for name in sorted({n for entry in per_rank for n in entry}):
        holders = {r: entry[name] for r, entry in enumerate(per_rank) if name in entry}
        if len(set(holders.values())) == 1:
            continue
        (common, count), *_ = Counter(holders.values()).most_common()
        if count * 2 > len(holders):
            found.append((name, [r for r, v in holders.items() if v != common]))
        else:
            found.append((name, list(holders)))
    return found


def replay_differences(per_rank: list[list[str]]) -> list[tuple[str, list[int]]]:
    """``[(name, ranks whose two runs of a replayed step differ on it)]``.

    >>> replay_differences([[], ["w:exp_avg"], []])
    [('w:exp_avg', [1])]
    """
    names = sorted({n for entry in per_rank for n in entry})
    return [(n, [r for r, entry in enumerate(per_rank) if n in entry]) for n in names]


#: ``"<parameter>:<state>"``: a parameter's optimizer state (``Backend.gather_weight_checksums``)
_STATE_KEY = re.compile(r"^(?P<parameter>.+):(?P<state>[A-Za-z_]\w*)$")


def finding(step: int, name: str, ranks: list[int], check: str) -> dict[str, Any]:
    """A finding as kept in ``CorruptionCheck.findings``.

    >>> finding(4, "w:exp_avg", [1], "replay")
    {'step': 4, 'parameter': 'w', 'ranks': [1], 'state': 'exp_avg', 'check': 'replay'}
    """
    entry: dict[str, Any] = {"step": step, "parameter": name, "ranks": ranks}
    if matched := _STATE_KEY.match(name):
        entry.update(parameter=matched["parameter"], state=matched["state"])
    if check != "replicas":
        entry["check"] = check
    return entry


@CALLBACKS.register("corruption_check")
class CorruptionCheck(Callback):
    """Compare data-parallel replicas bitwise (and replayed steps with themselves);
    stop or roll back on a mismatch.

    Args:
        every_n_steps: steps between comparisons of the replicas' weights and optimizer state.
        action: on a finding, "stop" the run or "rollback" to the last clean checkpoint.
        replay_every_n_steps: steps between replays of a step compared with itself
            (None: no replays).
    """

    priority = GUARD_PRIORITY

    def __init__(
        self,
        every_n_steps: int = 100,
        action: Literal["stop", "rollback"] = "stop",
        replay_every_n_steps: int | None = None,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if action not in ("stop", "rollback"):
            raise ValueError(f"action must be 'stop' or 'rollback', got {action!r}")
        if replay_every_n_steps is not None and replay_every_n_steps < 1:
            raise ValueError(
                f"replay_every_n_steps must be >= 1 (or None: no replay), "
                f"got {replay_every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self.action = action
        self.replay_every_n_steps = replay_every_n_steps
        #: each mismatch found: step, parameter, ranks (and state, check)
        self.findings: list[dict[str, Any]] = []
        #: steps replayed (their step numbers)
        self.replayed: list[int] = []
        self.last_good = LastGood()
        self._replay_due = False
        self._replaying = False

    def requires(self) -> frozenset[Ability]:
        if self.replay_every_n_steps is None:
            return frozenset({"weight_checksums"})
        return frozenset({"weight_checksums", "step_replay"})

    @property
    def last_good_step(self) -> int:
        """The last step whose replicas checked clean (or the step the run started at)."""
        return self.last_good.step

    def on_train_start(self, driver: DriverView) -> None:
        self.last_good.mark(driver.step)  # a resumed state was checked when saved

    def on_step_start(self, driver: DriverView) -> None:
        if self.last_good.roll_back_if_due(driver.checkpoint_dir, driver.rollback) is not None:
            log.warning("CorruptionCheck: rolled back to step %d", driver.step)
        every = self.replay_every_n_steps
        if every is not None and (driver.step + 1) % every == 0:
            self._replay_due = True
        if self._replay_due:
            backend = driver.backend
            self._replaying = backend.replay_next_step()
            self._replay_due = not self._replaying  # not yet: the next step then

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        found: list[tuple[str, list[int], str]] = []
        if self._replaying:
            self._replaying = False
            backend = driver.backend
            self.replayed.append(driver.step)
            mismatches = replay_differences(backend.gather_replay_mismatches())
            found += [(name, ranks, "replay") for name, ranks in mismatches]
        if driver.step % self.every_n_steps == 0:
            backend = driver.backend
            apart = disagreements(backend.gather_weight_checksums())
            found += [(name, ranks, "replicas") for name, ranks in apart]
            if not found:
                self.last_good.mark(driver.step)
        if found:
            self._act(driver, found)

    def _act(self, driver: DriverView, found: list[tuple[str, list[int], str]]) -> None:
        self.findings += [finding(driver.step, *entry) for entry in found]
        shown = "; ".join(
            f"{name} on rank(s) {', '.join(map(str, ranks))}"
            + (" (replayed step differs)" if check == "replay" else "")
            for name, ranks, check in found[:5]
        )
        checks = {check for *_, check in found}
        what = (
            f"replicas' weights differ at step {driver.step}: {shown}"
            if checks == {"replicas"}
            else f"silent corruption at step {driver.step}: {shown}"
        )
        if len(found) > 5:
            what += f" (and {len(found) - 5} more)"
        good = self.last_good.refuse_save(driver.control, what, driver.checkpoint_dir)
        if self.action == "rollback" and good is not None:
            log.error("CorruptionCheck: %s; rolling back to %s", what, good[0])
            self.last_good.roll_back_at_next_step(driver.step)
            return
        hint = " (no checkpoint to roll back to)" if self.action == "rollback" else ""
        log.error("CorruptionCheck: %s; stopping%s", what, hint)
        driver.control.request_stop(f"silent corruption: {what}", all_ranks=True)
