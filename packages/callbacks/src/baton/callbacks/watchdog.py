"""Watchdog: find hung and straggling ranks, write every rank's stacks, warn or abort.

Example::

    from baton.callbacks import Watchdog

    Driver(backend, callbacks=[Checkpoint(every_n_steps=200),
                               Watchdog(timeout_s=600, slow_factor=3.0, action="abort")],
           run_dir="runs/x", resume="auto")

Each rank runs a small monitor thread. The training thread only notes its progress in
memory (step started, step ended, evaluation, saving); every ``poll_s`` the thread
publishes it to ``RUN_DIR/watchdog/progress-rank<r>.json`` (one small atomic write per
rank per poll, never per step) and checks two conditions:

- **stalled**: no progress for ``timeout_s`` (checked once the attempt's first step,
  with its compilation, is done);
- **slow**: a step running longer than ``slow_factor`` x the median of the last
  ``window`` steps (and at least ``min_slow_s``).

On either, the rank reads every rank's progress file and names the ranks furthest
behind (lowest step and phase: the rank that never reached the collective the others
wait in), asks every rank for its Python stacks (a request file each monitor answers
with ``faulthandler.dump_traceback(all_threads=True)`` into
``RUN_DIR/watchdog/stacks-step<n>-<ms>-rank<r>.txt``), writes its view of the incident to
``incident-step<n>-<ms>-<kind>-rank<r>.json`` and logs it. Then, per ``action``, it warns (once per
step) or, for a stall, waits up to ``grace_s`` for every rank's stacks and ends the
process with ``exit_code``: torchrun (``--max-restarts``) or SLURM then restarts the
job and ``resume="auto"`` continues from the last checkpoint. A slow step only warns.

The run directory must be shared by the ranks (it is under SLURM and on one host).
``timeout_s`` must exceed the longest step, evaluation or blocking save.

Metric keys logged: none.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import socket
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from baton.core.callback import Callback
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView, StepOutput

log = logging.getLogger("baton")

#: the watchdog's folder in the run directory
WATCHDOG_DIR = "watchdog"

#: how far along a step each phase is, to order ranks that are at the same step
_PHASE_ORDER = {"step": 0, "step_end": 1, "between": 2}


@CALLBACKS.register("watchdog")
class Watchdog(Callback):
    """Name stuck or slow ranks, dump every rank's stacks, then warn or abort.

    Args:
        timeout_s: seconds without progress after which a rank counts as stalled
            (longer than the longest step, evaluation or blocking save).
        slow_factor: a step slower than this times the recent median is reported
            (None: slow steps are not checked).
        min_slow_s: a step shorter than this is never reported as slow.
        window: recent steps whose median time is the reference.
        action: on a stall, "warn" or "abort" (end the process with exit_code).
        poll_s: seconds between the monitor thread's checks.
        grace_s: seconds an abort waits for every rank's stacks.
        exit_code: the process's exit status on abort.
    """

    #: runs after every other callback on entry: ``step`` progress is noted just
    #: before the backend's step and ``step_end`` after every callback saw the step
    priority = 1000

    def __init__(
        self,
        timeout_s: float = 900.0,
        *,
        slow_factor: float | None = 5.0,
        min_slow_s: float = 1.0,
        window: int = 20,
        action: Literal["warn", "abort"] = "warn",
        poll_s: float = 5.0,
        grace_s: float = 30.0,
        exit_code: int = 3,
    ) -> None:
        if timeout_s <= 0 or poll_s <= 0 or grace_s < 0:
            raise ValueError("timeout_s and poll_s must be > 0 and grace_s >= 0")
        if slow_factor is not None and slow_factor <= 1:
            raise ValueError(f"slow_factor must be > 1 (or None to not check), got {slow_factor}")
        if action not in ("warn", "abort"):
            raise ValueError(f"action must be 'warn' or 'abort', got {action!r}")
        self.timeout_s = timeout_s
        self.slow_factor = slow_factor
        self.min_slow_s = min_slow_s
        self.action = action
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.exit_code = exit_code
        #: incidents this rank reported (each a dict as written to its incident file)
        self.incidents: list[dict[str, Any]] = []
        self._window = window
        self._durations: deque[float] = deque(maxlen=window)
        self._progress: dict[str, Any] = {}
        self._step_started = 0.0
        self._first_step_done = False
        self._reported: set[tuple[str, int]] = set()
        self._answered: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dir = Path()
        self._rank = 0
        self._world = 1

    # -- hooks (the training thread: in-memory notes only) ---------------------
    def on_train_start(self, driver: DriverView) -> None:
        self._dir = driver.options.run_dir / WATCHDOG_DIR
        self._dir.mkdir(parents=True, exist_ok=True)
        self._rank, self._world = driver.backend.rank, driver.backend.world_size
        # requests of earlier attempts were answered by them
        self._answered = {request.name for request in self._dir.glob("dump-*")}
        self._note(driver.step, "between")
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="baton-watchdog", daemon=True)
        self._thread.start()

    def on_step_start(self, driver: DriverView) -> None:
        self._step_started = time.monotonic()
        self._note(driver.step + 1, "step")

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        self._durations.append(time.monotonic() - self._step_started)
        self._first_step_done = True
        self._note(driver.step, "step_end")

    def on_eval_start(self, driver: DriverView) -> None:
        self._note(driver.step, "between")

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        self._note(driver.step, "between")

    def on_save_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        self._note(driver.step, "between")

    def on_train_end(self, driver: DriverView) -> None:
        self._halt()

    def on_teardown(self, driver: DriverView) -> None:
        self._halt()

    def _note(self, step: int, phase: str) -> None:
        self._progress = {"step": step, "phase": phase, "at": time.time(), "mono": time.monotonic()}

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(self.poll_s, 1.0) * 2)
        self._thread = None

    # -- the monitor thread ------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._publish()
                self._answer_requests()
                self._check()
            except OSError as error:  # a full or vanished disk must not kill training
                log.warning("watchdog: %s", error)

    def _publish(self) -> None:
        progress = dict(self._progress)
        progress.pop("mono", None)
        progress.update(rank=self._rank, pid=os.getpid(), host=socket.gethostname())
        _write_json(self._dir / f"progress-rank{self._rank}.json", progress)

    def _check(self) -> None:
        progress = dict(self._progress)
        if not progress:
            return
        idle = time.monotonic() - progress["mono"]
        step = int(progress["step"])
        if self._first_step_done and idle >= self.timeout_s:
            self._incident("stalled", step, f"no progress for {idle:.1f} s", idle)
        elif progress["phase"] == "step" and self._is_slow(idle):
            median = statistics.median(self._durations)
            detail = f"step {step} running {idle:.1f} s, {idle / median:.1f}x its median"
            self._incident("slow", step, detail, idle)

    def _is_slow(self, running: float) -> bool:
        if self.slow_factor is None or len(self._durations) < max(3, self._window // 4):
            return False
        limit = max(self.slow_factor * statistics.median(self._durations), self.min_slow_s)
        return running >= limit

    def _incident(self, kind: str, step: int, detail: str, idle: float) -> None:
        if (kind, step) in self._reported:
            return
        self._reported.add((kind, step))
        ranks = self._read_progress()
        behind = _furthest_behind(ranks)
        name = f"step{step}-{time.time_ns() // 1_000_000}"  # unique across attempts
        (self._dir / f"dump-{name}").touch()
        self._answer_requests()
        incident = {
            "kind": kind,
            "step": step,
            "detail": detail,
            "idle_s": round(idle, 3),
            "reported_by": self._rank,
            "behind": behind,
            "progress": ranks,
            "stacks": [str(self._stacks_path(name, r)) for r in range(self._world)],
            "at": time.time(),
        }
        self.incidents.append(incident)
        _write_json(self._dir / f"incident-{name}-{kind}-rank{self._rank}.json", incident)
        log.error(
            "watchdog (rank %d): %s: %s; furthest behind: rank(s) %s; stacks in %s",
            self._rank,
            kind,
            detail,
            ", ".join(map(str, behind)) or "none (all at the same point)",
            self._dir,
        )
        if kind == "stalled" and self.action == "abort":
            self._abort(name)

    def _abort(self, name: str) -> None:
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if all(self._stacks_path(name, r).exists() for r in range(self._world)):
                break
            time.sleep(min(self.poll_s, 0.5))
        log.error(
            "watchdog (rank %d): aborting with exit status %d so the launcher restarts the "
            "job; resume='auto' continues from the last checkpoint",
            self._rank,
            self.exit_code,
        )
        for handler in logging.getLogger("baton").handlers:
            handler.flush()
        os._exit(self.exit_code)  # the training thread is stuck: no orderly exit exists

    def _read_progress(self) -> dict[str, dict[str, Any]]:
        ranks: dict[str, dict[str, Any]] = {}
        for rank in range(self._world):
            path = self._dir / f"progress-rank{rank}.json"
            try:
                ranks[str(rank)] = json.loads(path.read_text())
            except (OSError, ValueError):
                ranks[str(rank)] = {"step": -1, "phase": "missing"}  # never reported
        return ranks

    def _answer_requests(self) -> None:
        for request in self._dir.glob("dump-*"):
            if request.name in self._answered:
                continue
            self._answered.add(request.name)
            path = self._stacks_path(request.name.removeprefix("dump-"), self._rank)
            with path.open("w") as out:
                out.write(f"# rank {self._rank} pid {os.getpid()} at {time.time():.3f}\n")
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)

    def _stacks_path(self, incident: str, rank: int) -> Path:
        return self._dir / f"stacks-{incident}-rank{rank}.txt"


def _furthest_behind(ranks: dict[str, dict[str, Any]]) -> list[int]:
    """The ranks with the least progress (lowest step, then earliest phase); none when
    several ranks are all at the same point (then the hang is in what they share)."""

    def position(entry: dict[str, Any]) -> tuple[int, int]:
        return int(entry.get("step", -1)), _PHASE_ORDER.get(str(entry.get("phase")), -1)

    positions = {int(rank): position(entry) for rank, entry in ranks.items()}
    if len(positions) == 1:
        return list(positions)
    if len(set(positions.values())) == 1:
        return []
    least = min(positions.values())
    return sorted(rank for rank, pos in positions.items() if pos == least)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
