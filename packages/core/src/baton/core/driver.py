"""The loop driver: one loop for every backend, readable in ``Driver.fit``.

Example::

    from baton.core import Driver
    from baton.backends.fabric import FabricBackend

    backend = FabricBackend(model=net, optimizer=make_optimizer, data=loader)
    driver = Driver(backend, callbacks=[...], max_steps=100,
                    run_dir="runs/quickstart", resume="auto")
    result = driver.fit()
    print(result.stop_reason, result.step)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.core import checkpointing as ckpt
from baton.core.backend import (
    Ability,
    Backend,
    DataExhausted,
    Evaluates,
    PendingSave,
    check_abilities,
    installed_version,
)
from baton.core.callback import Callback
from baton.core.control import Control
from baton.core.dispatch import Dispatcher
from baton.core.errors import UsageError
from baton.core.launch import Launch, LaunchError, restart_count
from baton.core.metrics import StepOutput
from baton.core.model_spec import check_same_architecture
from baton.core.overrides import to_jsonable
from baton.core.patches import PatchDecision, select_patches
from baton.core.resume_settings import (
    TRAINING_SETTINGS,
    changed_settings,
    check_changes,
    parse_allowed,
)
from baton.core.rundir import RunDirLock, set_aside

log = logging.getLogger("baton")

#: the run record written at start, beside ``patches.json``
RUN_RECORD = "run.json"


@dataclass
class RunResult:
    """What ``fit`` returns."""

    step: int
    tokens: int
    samples: int
    train_time_s: float
    stop_reason: str
    resumed_from: Path | None = None
    checkpoints: list[Path] = field(default_factory=list)


@dataclass
class _PendingCheckpoint:
    tmp: Path
    final: Path
    meta: dict[str, Any]
    handle: PendingSave | None
    #: the backend files' manifest, hashed off the training thread (async saves)
    files: Future[dict[str, Any]] | None = None


class Driver:
    """Owns the training loop; the backend supplies one optimizer step at a time.

    Args:
        backend: a ``Backend`` (its native ``config`` is editable in ``on_configure``).
        callbacks: callbacks and patches; registered patches of the backend are added.
        max_steps / max_tokens / max_time_s: stop conditions (any that is set).
        log_every: the log cadence; metrics reach the host only on log steps.
        eval_every: evaluate every N steps (``None``: only when a callback asks);
            evaluation is its own phase: its metrics reach ``on_eval_end``, not ``on_log``.
        run_dir: where checkpoints and logs go (``runs/<name>``).
        resume: ``"none"``, ``"auto"`` (``latest`` if valid, else the newest complete
            checkpoint) or a checkpoint path. With ``"none"`` a run directory that holds
            checkpoints is refused unless ``overwrite`` moves them aside.
        patches: patch selection (``all``, ``none``, ``a,b``, ``all,-a``);
            ``None`` reads ``BATON_PATCHES``.
        settings: the recipe's parameters, recorded in each checkpoint and compared
            with the checkpoint's on resume.
        save_on_stop: write a checkpoint whenever the run stops (end, limits, signals).
        async_save: save asynchronously where the backend can (``async_save`` ability).
        verify: how resume checks a checkpoint: ``"full"`` (sizes and checksums) or
            ``"size"`` (sizes only, for huge checkpoints).
        overwrite: start fresh where checkpoints exist, renaming the old ``checkpoints``
            and ``logs`` aside (never deleting them).
        allow_changed: training settings (``"lr,max_steps"``, ``"all"``) that may differ
            from the checkpoint's on resume; others are refused.
        training_settings: more setting names whose change on resume is refused
            (added to ``baton.core.resume_settings.TRAINING_SETTINGS``).

    The run directory is locked for the run (``baton.core.rundir``): a second run on it
    fails at once naming the holder.

    Callbacks that own the save policy (``Checkpoint``) set it through
    ``configure_saving`` in ``on_configure``; a guard that must not let a broken state
    be saved calls ``control.veto_save``; a rollback is ``rollback(path)``.
    """

    def __init__(
        self,
        backend: Backend,
        callbacks: Sequence[Callback] = (),
        *,
        max_steps: int | None = None,
        max_tokens: int | None = None,
        max_time_s: float | None = None,
        log_every: int = 10,
        eval_every: int | None = None,
        run_dir: str | Path = "runs/baton",
        resume: str | Path = "none",
        patches: str | None = None,
        settings: dict[str, Any] | None = None,
        save_on_stop: bool = False,
        async_save: bool = False,
        verify: str = "full",
        overwrite: bool = False,
        allow_changed: str | Iterable[str] = (),
        training_settings: Iterable[str] = (),
    ) -> None:
        _check_limits(max_steps, max_tokens, max_time_s, log_every, eval_every)
        self.backend = backend
        self.callbacks: list[Callback] = list(callbacks)
        self.max_steps = max_steps
        self.max_tokens = max_tokens
        self.max_time_s = max_time_s
        self.log_every = log_every
        self.eval_every = eval_every
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.patch_selection = patches
        self.settings: dict[str, Any] = dict(settings or {})
        self.verify = verify
        self.overwrite = overwrite
        self.allow_changed: set[str] = parse_allowed(allow_changed)
        self.training_settings: set[str] = set(TRAINING_SETTINGS) | set(training_settings)
        ckpt.check_verify(verify)

        self.control = Control()
        #: write a checkpoint whenever the run stops (see ``configure_saving``)
        self.save_on_stop = save_on_stop
        #: save asynchronously where the backend supports it (see ``configure_saving``)
        self.async_save = async_save

        self.step = 0
        self.tokens = 0
        #: wall time this process spent in evaluation, and blocked in checkpoint saves
        #: (an async save's background write is not counted), for honest throughput
        self.eval_time_s = 0.0
        self.save_blocking_s = 0.0
        self.samples = 0
        self.train_time_s = 0.0
        self.stop_reason = ""
        self.resumed_from: Path | None = None
        self.patch_report: list[PatchDecision] = []
        self.saved: list[Path] = []
        self._extra_lazy: dict[str, Any] = {}
        self._pending: list[_PendingCheckpoint] = []
        self._clock_start = 0.0
        self._time_before = 0.0
        self._dispatch = Dispatcher([])
        self._abilities: frozenset[Ability] = frozenset()
        self._training = False
        self._lock: RunDirLock | None = None
        #: the verified checkpoint to load first, and the fallbacks, verified when needed
        self._first: tuple[Path, dict[str, Any]] | None = None
        self._fallbacks: list[Path] = []
        self._resume_failures: list[str] = []
        self._allowed_now: dict[str, tuple[Any, Any]] = {}
        self._evaluating = False
        #: changes of training settings allowed on resume, recorded in each checkpoint
        self.resume_changes: list[dict[str, Any]] = []
        self._hasher: ThreadPoolExecutor | None = None

    # -- properties ----------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def is_global_zero(self) -> bool:
        return self.backend.rank == 0

    def record(self, name: str, value: Any) -> None:
        """Add a lazy value to the next log step's single host transfer."""
        self._extra_lazy[name] = value

    def dispatch(self, hook: str, *args: Any) -> None:
        self._dispatch(hook, self, *args)

    @property
    def abilities(self) -> frozenset[Ability]:
        """The backend's optional abilities (known after ``backend.setup``)."""
        return self._abilities

    def configure_saving(
        self, *, on_stop: bool | None = None, asynchronous: bool | None = None
    ) -> None:
        """Set the save policy (from a callback's ``on_configure`` or ``on_setup``):
        ``on_stop`` writes a checkpoint whenever the run stops, ``asynchronous`` saves
        in the background where the backend can. ``None`` leaves a setting as it is."""
        if self._training:
            raise RuntimeError(
                "configure_saving after training started: call it in on_configure or on_setup"
            )
        if on_stop is not None:
            self.save_on_stop = on_stop
        if asynchronous is not None:
            self.async_save = asynchronous

    # -- the loop ---------------------------------------------------------------------
    def fit(self) -> RunResult:
        """Run training to a stop condition; always tears down, even when it raises."""
        self._prepare()
        try:
            self.dispatch("on_configure")
            self.backend.setup()
            self._abilities = self._check_abilities()
            self._write_patch_report()
            self.dispatch("on_setup")
            self._resume()
            self._write_run_record()
            self._clock_start = time.monotonic()
            self._time_before = self.train_time_s
            self._training = True
            self.dispatch("on_train_start")
            while not self._limit_reached_before_step():
                self.dispatch("on_step_start")
                try:
                    output = self.backend.train_step(self.step + 1)
                except DataExhausted as end:
                    self._stop_at_data_end(str(end))
                    break
                self.step += 1
                self.tokens += output.tokens
                self.samples += output.samples
                self.train_time_s = self._time_before + time.monotonic() - self._clock_start
                self._check_limits()
                self.dispatch("on_step_end", output)
                if self._handle_events(output):
                    break
                self._poll_pending(block=False)
            self._poll_pending(block=True)
            self.dispatch("on_train_end")
        except BaseException as error:
            self.stop_reason = self.stop_reason or f"error: {type(error).__name__}: {error}"
            self._finish_after_error(error)
            self._teardown(failed=True)
            raise
        self._teardown()
        return RunResult(
            step=self.step,
            tokens=self.tokens,
            samples=self.samples,
            train_time_s=self.train_time_s,
            stop_reason=self.stop_reason,
            resumed_from=self.resumed_from,
            checkpoints=list(self.saved),
        )

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]:
        """Evaluation only: build the backend, load the checkpoint at ``path`` (verified
        like a resume; settings may differ, nothing is trained), evaluate once and hand
        the metrics to the callbacks (``on_eval_end``: loggers write them at the
        checkpoint's step). Nothing is trained or saved.

        Example::

            metrics = driver.evaluate_checkpoint("runs/quickstart/checkpoints/latest")
            metrics["eval/loss"]
        """
        self.resume = str(path)
        self.allow_changed = {"all"}  # the weights are evaluated as they are
        self._evaluating = True  # nothing trains: changed settings need no applying
        self._prepare()
        try:
            self.dispatch("on_configure")
            self.backend.setup()
            self.dispatch("on_setup")
            self._resume()
            self.dispatch("on_train_start")
            metrics = self._evaluate()
            self.stop_reason = f"evaluated {path}"
            self.dispatch("on_train_end")
        except BaseException as error:
            self._finish_after_error(error)
            self._teardown(failed=True)
            raise
        self._teardown()
        return metrics

    def _handle_events(self, output: StepOutput) -> bool:
        """Log, evaluate, save (last), then stop: returns True when the loop must end."""
        acting = self._actionable_flags()
        if "log" in acting or self.step % self.log_every == 0:
            self._log(output)
        if "eval" in acting or (self.eval_every and self.step % self.eval_every == 0):
            started = time.perf_counter()
            self._evaluate()
            self.eval_time_s += time.perf_counter() - started
        acting = self._after_log_and_eval(acting)
        stop = "stop" in acting
        vetoed = self.control.save_vetoed is not None
        if not vetoed and ("save" in acting or (stop and self.save_on_stop)):
            started = time.perf_counter()
            self._save(self.control.reason("save") or f"stop: {self.control.reason('stop')}")
            self.save_blocking_s += time.perf_counter() - started
        if stop:
            self.stop_reason = self.control.reason("stop")
            log.info("stopping at step %d: %s", self.step, self.stop_reason)
        self._clear(acting)
        return stop

    def _stop_at_data_end(self, reason: str) -> None:
        self.stop_reason = reason
        log.info("stopping after step %d: %s", self.step, reason)
        if self.save_on_stop and self.step > 0:
            self._save(f"stop: {reason}")

    # -- stop conditions ----------------------------------------------------------
    def _limit_reached_before_step(self) -> bool:
        if self.max_steps is not None and self.step >= self.max_steps:
            self.stop_reason = self.stop_reason or f"max_steps={self.max_steps} reached"
            return True
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            self.stop_reason = self.stop_reason or f"max_tokens={self.max_tokens} reached"
            return True
        return False

    def _check_limits(self) -> None:
        if self.max_steps is not None and self.step >= self.max_steps:
            self.control.request_stop(f"max_steps={self.max_steps} reached", all_ranks=True)
            self.control.request_log("last step", all_ranks=True)
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            self.control.request_stop(f"max_tokens={self.max_tokens} reached", all_ranks=True)
            self.control.request_log("last step", all_ranks=True)
        if self.max_time_s is not None and self.train_time_s >= self.max_time_s:
            # wall clocks differ across ranks: agreed at the next log step
            self.control.request_stop(f"max_time_s={self.max_time_s:g} reached")
            self.control.request_log("time limit")

    def _actionable_flags(self) -> set[str]:
        """Flags to act on now. With several ranks, flags not every rank raised wait
        for the log cadence, where one OR-reduction makes every rank agree."""
        ctl = self.control
        if self.backend.world_size > 1:
            if self.step % self.log_every == 0:
                ctl.merge(self.backend.all_reduce_flags(ctl.as_list()))
            else:
                return {f for f in ctl.agreed if getattr(ctl, f)}
        return {f for f in ("stop", "save", "eval", "log") if getattr(ctl, f)}

    def _after_log_and_eval(self, acting: set[str]) -> set[str]:
        """Stop and save requests made while logging or evaluating (a NaN guard, early
        stopping) act at this step; a request withdrawn there (``control.withdraw``) does
        not. With several ranks only requests every rank made (``all_ranks``) join now."""
        ctl = self.control
        acting = {f for f in acting if getattr(ctl, f)}
        for flag in ("stop", "save"):
            if getattr(ctl, flag) and (self.backend.world_size == 1 or flag in ctl.agreed):
                acting.add(flag)
        return acting

    def _clear(self, flags: set[str]) -> None:
        for flag in flags:
            setattr(self.control, flag, False)
            self.control.reasons.pop(flag, None)
            self.control.agreed.discard(flag)
        self.control.save_vetoed = None

    # -- log and eval -----------------------------------------------------------------
    def _log(self, output: StepOutput) -> None:
        lazy = output.lazy_values()
        lazy.update(self._extra_lazy)
        self._extra_lazy = {}
        metrics = self.backend.fetch(lazy)
        metrics.update(
            tokens=float(self.tokens), samples=float(self.samples), train_time_s=self.train_time_s
        )
        self.dispatch("on_log", metrics)

    def _evaluate(self) -> dict[str, float]:
        """The evaluation phase: its metrics (keys ``eval/...``) go to ``on_eval_end``."""
        backend = self.backend
        if not isinstance(backend, Evaluates):
            raise RuntimeError(f"backend {backend.name!r} cannot evaluate (no evaluate())")
        self.dispatch("on_eval_start")
        values = backend.fetch(dict(backend.evaluate()))
        metrics = {k if k.startswith("eval/") else f"eval/{k}": v for k, v in values.items()}
        self.dispatch("on_eval_end", metrics)
        return metrics

    # -- checkpoints ------------------------------------------------------------------
    def _checkpoint_meta(self, reason: str) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for cb in self.callbacks:
            if cb.state_key is not None:
                states[cb.state_key] = cb.state_dict()
        return {
            "format": 2,
            "step": self.step,
            "tokens": self.tokens,
            "samples": self.samples,
            "train_time_s": self.train_time_s,
            "reason": reason,
            "saved_at": time.time(),
            "backend": {
                "name": self.backend.name,
                "version": self.backend.version,
                "world_size": self.backend.world_size,
                **self.backend.describe(),
            },
            "callbacks": states,
            "settings": self.settings,
            "driver": self._limits(),
            "resume_changes": self.resume_changes,
            "patches": [d.name for d in self.patch_report if d.applied],
            "versions": _versions(self.backend),
        }

    def save_checkpoint(self, reason: str = "requested") -> None:
        """Write a checkpoint of the current step now (``control.request_save`` defers it)."""
        self._save(reason)

    def wait_for_saves(self) -> None:
        """Block until every checkpoint still being written is complete (renamed,
        ``latest`` updated, ``on_checkpoint_saved`` called). Call it on every rank."""
        self._poll_pending(block=True)

    def _save(self, reason: str) -> None:
        name = ckpt.checkpoint_name(self.step)
        if any(p.final.name == name for p in self._pending) or (
            self.saved and self.saved[-1].name == name
        ):
            return  # this step is already saved or being saved
        root = self.checkpoint_dir
        final = root / ckpt.checkpoint_name(self.step)
        tmp = root / f"{ckpt.TMP_PREFIX}{final.name}"
        if self.is_global_zero:
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / ckpt.BACKEND_DIR).mkdir(parents=True)
        self.backend.barrier()
        meta = self._checkpoint_meta(reason)
        self.dispatch("on_save_checkpoint", meta)
        asynchronous = self.async_save and "async_save" in self._abilities
        try:
            handle = self.backend.save(tmp / ckpt.BACKEND_DIR, asynchronous=asynchronous)
        except BaseException:
            # a failed write leaves no half-checkpoint behind; the complete ones stay
            if self.is_global_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._pending.append(_PendingCheckpoint(tmp, final, meta, handle))
        if handle is None:
            self._poll_pending(block=True)

    def _poll_pending(self, *, block: bool, collective: bool = True) -> None:
        """Finish saves whose writes are done: rename, ``latest``, ``on_checkpoint_saved``.

        With several ranks an asynchronous save is complete only when every rank's part
        is written, so ranks ask each other (one small all-reduce) at the log cadence
        and then finish it together, between two barriers. ``collective=False`` (the
        error path, which may run on one rank alone) waits locally and uses no barrier.
        """
        multi = collective and self.backend.world_size > 1
        while self._pending:
            item = self._pending[0]
            if item.handle is not None and not block:
                if item.files is None and not self._all_written(item, multi):
                    return
                if not multi and self.is_global_zero and not self._hashed(item):
                    return  # written; its checksums are computed in the background
            self._pending.pop(0)
            if item.handle is not None:
                try:
                    item.handle.wait()
                except BaseException:
                    if self.is_global_zero:
                        shutil.rmtree(item.tmp, ignore_errors=True)
                    raise
                if not multi and self.is_global_zero:
                    self._hashed(item)  # an asynchronous save is always hashed off-thread
            if item.handle is None or multi:
                self.backend.barrier()
            if self.is_global_zero:
                files = item.files.result() if item.files is not None else None
                ckpt.finalize(item.tmp, item.final, item.meta, files)
                log.info("checkpoint %s saved (%s)", item.final, item.meta["reason"])
            if item.handle is None or multi:
                self.backend.barrier()
            self.saved.append(item.final)
            self.dispatch("on_checkpoint_saved", item.final)

    def _hashed(self, item: _PendingCheckpoint) -> bool:
        """Start hashing a written asynchronous save off the training thread; whether
        its manifest is ready."""
        if item.files is None:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(1, thread_name_prefix="baton-checksum")
            item.files = self._hasher.submit(ckpt.manifest, item.tmp / ckpt.BACKEND_DIR)
        return item.files.done()

    def _all_written(self, item: _PendingCheckpoint, multi: bool) -> bool:
        assert item.handle is not None
        if not multi:
            return item.handle.done()
        if self.step % self.log_every != 0:
            return False  # ranks agree only at the log cadence: no collective per step
        unfinished = self.backend.all_reduce_flags([not item.handle.done()])
        return not unfinished[0]

    def _resume_path(self) -> Path:
        """The checkpoint ``resume`` names: a path, or a name under ``checkpoints/``."""
        path = Path(self.resume)
        if not path.exists() and (self.checkpoint_dir / path).exists():
            path = self.checkpoint_dir / path
        return path

    def _find_resume_candidates(self) -> None:
        """Before anything is built: the checkpoint to resume from, verified. With
        ``auto`` the others are fallbacks, verified only if the first fails to load."""
        if self.resume in (None, "", "none"):
            return
        if str(self.resume) == "auto":
            self._fallbacks = ckpt.ordered(self.checkpoint_dir)
            self._first = self._next_candidate()
            if self._first is None and self._resume_failures:
                raise ckpt.CheckpointError(
                    f"resume=auto: {self.checkpoint_dir} holds checkpoints but none can be "
                    "loaded:\n  " + "\n  ".join(self._resume_failures) + "\nrestore them, "
                    "resume from a copy with --resume PATH, or start over with --overwrite "
                    "(moves them aside)"
                )
            if self._first is None:
                log.info(
                    "resume=auto: no complete checkpoint in %s, starting fresh", self.checkpoint_dir
                )
            return
        path = self._resume_path()
        self._first = (path, ckpt.read_meta(path, self.verify))

    def _next_candidate(self) -> tuple[Path, dict[str, Any]] | None:
        """The next fallback that passes verification; broken ones are warned about."""
        while self._fallbacks:
            path = self._fallbacks.pop(0)
            try:
                return path, ckpt.read_meta(path, self.verify)
            except ckpt.CheckpointError as error:
                log.warning("skipping checkpoint: %s", error)
                self._resume_failures.append(str(error))
        return None

    def _check_first_candidate(self) -> None:
        """Refuse changed training settings before the backend builds anything."""
        if self._first is not None:
            self._check_settings(*self._first)

    def _resume(self) -> None:
        candidate, tried = self._first, False
        while candidate is not None:
            path, meta = candidate
            tried = True
            self._check_compatible(path, meta)
            self._check_settings(path, meta)
            try:
                self.backend.load(path / ckpt.BACKEND_DIR)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as error:  # a corrupt checkpoint: try the previous one
                # (torch's CheckpointException derives from BaseException)
                reason = _error_summary(error)
                self._resume_failures.append(f"{path}: {reason}")
                log.warning("could not load checkpoint %s (%s); trying an older one", path, reason)
                candidate = self._next_candidate()
                continue
            self._apply_allowed_changes(path)
            self._restore(path, meta)
            return
        if tried:
            raise ckpt.CheckpointError(
                "no checkpoint could be loaded:\n  "
                + "\n  ".join(self._resume_failures)
                + "\nresume from another checkpoint with --resume PATH, or start over with "
                "--overwrite"
            )

    def _limits(self) -> dict[str, Any]:
        return {
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "max_time_s": self.max_time_s,
        }

    def _check_settings(self, path: Path, meta: dict[str, Any]) -> None:
        """Refuse a resume whose training settings differ from the checkpoint's unless
        ``allow_changed`` names them; allowed changes are logged and recorded.

        Only recipe settings are compared: the driver's own limits (``max_steps`` given
        to ``Driver``) are applied by the loop as they are and logged when they differ.
        An allowed change that neither the backend nor the driver applies is refused.
        """
        check_same_architecture(
            meta.get("settings", {}).get("model_spec"),
            self.settings.get("model_spec"),
            what=f"checkpoint {path}",
        )
        names = self.training_settings | set(getattr(self.backend, "training_settings", ()))
        changes = changed_settings(meta.get("settings", {}), self.settings, names)
        allowed = check_changes(changes, self.allow_changed, path)
        self.resume_changes = list(meta.get("resume_changes", []))
        self._allowed_now = allowed
        if not self._evaluating:  # refuse, before anything is built, what no one applies
            self._appliers(allowed, path)
        if allowed:
            for name, (old, new) in allowed.items():
                log.warning(
                    "resuming with %s changed from %r to %r (allowed by allow_changed)",
                    name,
                    old,
                    new,
                )
            self.resume_changes.append(
                {
                    "step": int(meta.get("step", 0)),
                    "changes": {k: {"checkpoint": o, "now": n} for k, (o, n) in allowed.items()},
                }
            )
        for name, old in meta.get("driver", {}).items():
            new = self._limits().get(name)
            if old != new:
                log.info(
                    "resuming with the driver's %s %r (the checkpoint's run had %r)", name, new, old
                )

    def _appliers(self, changes: dict[str, tuple[Any, Any]], path: Path) -> dict[str, str]:
        """Who applies each allowed change: ``"backend"`` for the settings the backend
        re-applies to the state it restores (its ``changeable_settings``), ``"driver"`` for
        the driver's own limits (``max_steps`` given to ``Driver``) that no restored state
        depends on; a change nobody applies is refused (``UsageError``)."""
        backend_names = set(getattr(self.backend, "changeable_settings", ()))
        limits = self._limits()
        appliers: dict[str, str] = {}
        for name, (old, new) in changes.items():
            by_driver = name in limits and limits[name] == new
            if name in backend_names:
                appliers[name] = "backend and driver" if by_driver else "backend"
            elif by_driver:
                appliers[name] = "driver"
            else:
                self._refuse_unapplied(path, name, old, new)
        return appliers

    def _refuse_unapplied(self, path: Path, name: str, old: Any, new: Any) -> None:
        flag = "--" + name.replace("_", "-")
        raise UsageError(
            f"resuming from {path} with {name} changed ({old!r} -> {new!r}): backend "
            f"{self.backend.name!r} cannot apply a changed {name} to the state it restores "
            f"from the checkpoint, so the run would not train as recorded; resume with the "
            f"checkpoint's value ({flag} {old}) or start a new run in another run directory"
        )

    def _apply_allowed_changes(self, path: Path) -> None:
        """After loading: the backend re-applies the allowed changes its restored state
        would override (an optimizer's learning rate, a schedule built for another length)
        in ``apply_changed_settings(changes) -> applied names``; the driver applies its
        own limits. What is recorded (``"applied_by"``) was applied; a change the backend
        claims but did not apply is refused."""
        if not self._allowed_now or self._evaluating:
            return
        appliers = self._appliers(self._allowed_now, path)
        wanted = {k: v for k, v in self._allowed_now.items() if "backend" in appliers[k]}
        hook = getattr(self.backend, "apply_changed_settings", None)
        applied = set(hook(dict(wanted))) if hook is not None and wanted else set()
        record = self.resume_changes[-1]["changes"]
        for name, (old, new) in self._allowed_now.items():
            if name in wanted and name not in applied:
                self._refuse_unapplied(path, name, old, new)
            record[name]["applied_by"] = appliers[name]

    def load_checkpoint(self, path: str | Path | None = None, *, callbacks: bool = False) -> Path:
        """Restore a complete checkpoint in the middle of a run (a rollback).

        ``path=None`` takes the newest complete one. The backend state (weights,
        optimizer, data position, RNG) and the step, token and time counters come back;
        callback states only with ``callbacks=True`` (a guard that rolls back keeps its
        own memory of why). Call it from ``on_step_start``: the next step is then the
        one after the checkpoint's. Raises ``CheckpointError`` when none can be loaded.
        """
        self._poll_pending(block=True)  # a save still being written completes first
        if path is None:
            candidates = ckpt.resumable(self.checkpoint_dir, self.verify)
            if not candidates:
                raise ckpt.CheckpointError(f"no complete checkpoint in {self.checkpoint_dir}")
            path, meta = candidates[0]
        else:
            path = Path(path)
            meta = ckpt.read_meta(path, self.verify)
        self._check_compatible(path, meta)
        self.backend.load(path / ckpt.BACKEND_DIR)
        self._restore(path, meta, callbacks=callbacks)
        self._clock_start = time.monotonic()
        self._time_before = self.train_time_s
        return path

    def rollback(self, path: str | Path) -> Path:
        """Go back to the complete checkpoint ``path``, abandoning what came after it.

        Checkpoints newer than ``path`` belong to the abandoned timeline: they are
        deleted and ``latest`` points at ``path`` again (on rank 0, between barriers);
        then the backend state and the counters come back as in ``load_checkpoint``
        (callback states stay). Call it from ``on_step_start``.
        """
        path = Path(path)
        meta = ckpt.read_meta(path)
        self._poll_pending(block=True)
        target = int(meta["step"])
        if self.is_global_zero:
            for later in ckpt.list_checkpoints(self.checkpoint_dir):
                if (ckpt.checkpoint_step(later) or 0) > target:
                    ckpt.remove_checkpoint(later)
            ckpt.update_latest(self.checkpoint_dir, path)
        self.backend.barrier()
        self.saved = [p for p in self.saved if (ckpt.checkpoint_step(p) or 0) <= target]
        return self.load_checkpoint(path)

    def _check_compatible(self, path: Path, meta: dict[str, Any]) -> None:
        saved = meta.get("backend", {})
        current = {"name": self.backend.name, **self.backend.describe()}
        diffs = [
            f"{k}: checkpoint has {saved.get(k)!r}, this run has {v!r}"
            for k, v in current.items()
            if k in saved and saved[k] != v
        ]
        if diffs:
            raise ckpt.CheckpointError(
                f"checkpoint {path} was written by a different setup:\n  "
                + "\n  ".join(diffs)
                + "\nresume with the settings it was saved with, or start a new run_dir"
            )

    def _restore(self, path: Path, meta: dict[str, Any], *, callbacks: bool = True) -> None:
        self.step = int(meta["step"])
        self.tokens = int(meta["tokens"])
        self.samples = int(meta.get("samples", 0))
        self.train_time_s = float(meta.get("train_time_s", 0.0))
        states = meta.get("callbacks", {})
        for cb in self.callbacks:
            if cb.state_key is None or not callbacks:
                continue
            if cb.state_key in states:
                cb.load_state_dict(states[cb.state_key])
            else:
                log.warning("checkpoint %s has no state for callback %r", path, cb.state_key)
        if callbacks:
            self.resumed_from = path
            log.info("resumed from %s at step %d", path, self.step)
        else:
            log.info("rolled back to %s (step %d)", path, self.step)
        self.dispatch("on_load_checkpoint", meta)

    # -- start and end ----------------------------------------------------------------
    def _prepare(self) -> None:
        """Check every option, lock the run directory, decide what to resume from:
        all before the backend builds anything. A failure leaves the run directory as
        it was (one this run created is removed again)."""
        self._check_restart()
        restarts = restart_count()
        if restarts and self.resume in (None, "", "none"):
            log.warning("restart %d of this job: resuming from its newest checkpoint", restarts)
            self.resume = "auto"
        _check_limits(
            self.max_steps, self.max_tokens, self.max_time_s, self.log_every, self.eval_every
        )
        ckpt.check_verify(self.verify)
        self.allow_changed = parse_allowed(self.allow_changed)
        if self.resume not in (None, "", "none", "auto") and not self._resume_path().is_dir():
            raise UsageError(
                f"resume={str(self.resume)!r}: no checkpoint directory there; pass --resume auto "
                f"(the newest in {self.checkpoint_dir}) or a path like "
                f"{self.checkpoint_dir / ckpt.checkpoint_name(100)}"
            )
        try:
            launch = Launch.from_env()
        except LaunchError as error:
            raise UsageError(f"{error}; fix the launch environment variables") from None
        try:
            patches, self.patch_report = select_patches(self.backend, self.patch_selection)
        except ValueError as error:
            raise UsageError(str(error)) from None
        user = [cb for cb in self.callbacks if not any(type(cb) is type(p) for p in patches)]
        self.callbacks = [*patches, *user]
        keys = [cb.state_key for cb in self.callbacks if cb.state_key is not None]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise UsageError(
                f"callbacks share state_key {duplicates}: give each stateful callback a unique "
                "state_key so checkpoints can tell their states apart"
            )
        self._dispatch = Dispatcher(self.callbacks)
        if launch.rank == 0:
            self._lock = RunDirLock(self.run_dir)
            try:
                self._lock.acquire()
            except OSError as error:
                raise UsageError(
                    f"cannot create or lock the run directory {self.run_dir} "
                    f"({error.strerror or error}); choose a writable --run-dir"
                ) from None
        try:
            self._claim_checkpoints(launch)
            self._find_resume_candidates()
            self._check_first_candidate()
        except BaseException:
            self._release_lock(failed=True)
            raise

    def _claim_checkpoints(self, launch: Launch) -> None:
        """Refuse to start over where checkpoints exist, unless ``overwrite``."""
        if self.resume not in (None, "", "none"):
            return
        existing = ckpt.list_checkpoints(self.checkpoint_dir)
        if not existing:
            return
        if not self.overwrite:
            raise UsageError(
                f"{self.checkpoint_dir} already holds checkpoints (newest {existing[-1].name}); "
                "continue them with --resume auto, start a new run with a fresh --run-dir, or "
                "pass --overwrite to move them aside"
            )
        if launch.rank == 0:
            for moved in set_aside(self.run_dir):
                log.warning("overwrite: moved %s aside to %s", moved.name.split(".")[0], moved)

    def _release_lock(self, *, failed: bool) -> None:
        if self._lock is not None:
            self._lock.release(remove_if_unused=failed)
            self._lock = None

    def _check_restart(self) -> None:
        """A restarted job (torchrun elastic, SLURM requeue) whose run directory is gone
        has nothing to resume from: say so instead of silently starting over."""
        restarts = restart_count()
        if restarts and not self.run_dir.exists():
            raise ckpt.CheckpointError(
                f"this is restart {restarts} of the job, but its run directory {self.run_dir} "
                "is gone: nothing to resume. Restore it, or submit a new job to start fresh"
            )

    def _check_abilities(self) -> frozenset[Ability]:
        """The one place optional backend abilities are checked: what the settings and
        each callback's ``requires`` need must be there before the first step."""
        needs: dict[str, set[Ability]] = {}
        if self.eval_every:
            needs[f"eval_every={self.eval_every}"] = {"evaluate"}
        if self.backend.world_size > 1:
            needs[f"a run on {self.backend.world_size} ranks"] = {"multi_rank"}
        for cb in self.callbacks:
            wanted = cb.requires()
            if wanted:
                needs.setdefault(repr(cb), set()).update(wanted)
        have = check_abilities(self.backend, needs)
        if self.async_save and "async_save" not in have:
            log.info("backend %s saves synchronously (no async_save ability)", self.backend.name)
        return have

    def _write_patch_report(self) -> None:
        """``run_dir/patches.json`` and the log lines: after ``setup``, when the backend
        knows its rank (before it, every process of a multi-rank run looks like rank 0)."""
        if self.is_global_zero:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            report = [dataclasses.asdict(d) for d in self.patch_report]
            ckpt.write_json_atomic(
                self.run_dir / "patches.json",
                {"backend": self.backend.name, "version": self.backend.version, "patches": report},
            )
        for decision in self.patch_report:
            log.info(
                "patch %-32s %s (%s)",
                decision.name,
                "applied" if decision.applied else "skipped",
                decision.reason,
            )

    def _write_run_record(self) -> None:
        """``run_dir/run.json`` once the run is about to train (rank 0): resolved settings,
        the backend's native config, command line, git commit, versions, hosts, world
        size and the checkpoint it resumed from. A run that stops before its first
        checkpoint still leaves it; a run refused at start leaves the last one as it was."""
        if not self.is_global_zero:
            return
        launch = Launch.from_env()
        record = {
            "settings": self.settings,
            "limits": {
                "max_steps": self.max_steps,
                "max_tokens": self.max_tokens,
                "max_time_s": self.max_time_s,
                "log_every": self.log_every,
                "eval_every": self.eval_every,
            },
            "backend": {
                "name": self.backend.name,
                "version": self.backend.version,
                **self.backend.describe(),
            },
            "native_config": to_jsonable(self.backend.config),
            "callbacks": [repr(cb) for cb in self.callbacks],
            "command": list(sys.argv),
            "cwd": os.getcwd(),
            "git": _git_state(),
            "versions": _versions(self.backend),
            "host": socket.gethostname(),
            "world_size": self.backend.world_size,
            "launch": dataclasses.asdict(launch),
            "started_at": time.time(),
            "resumed_from": None if self.resumed_from is None else str(self.resumed_from),
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_json_atomic(self.run_dir / RUN_RECORD, record)

    def _finish_after_error(self, error: BaseException) -> None:
        try:  # saves already in flight are complete work: keep them
            self._poll_pending(block=True, collective=False)
        except Exception as save_error:
            log.error("a pending checkpoint failed while handling an error: %r", save_error)
        for handler in self._dispatch.handlers("on_exception"):
            try:
                handler(self, error)
            except Exception as hook_error:
                log.error("on_exception handler %r raised %r", handler, hook_error)

    def _teardown(self, failed: bool = False) -> None:
        try:
            self.backend.teardown()
        except Exception as error:
            log.error("backend teardown raised %r", error)
        for handler in self._dispatch.handlers("on_teardown"):
            try:
                handler(self)
            except Exception as error:
                log.error("on_teardown handler %r raised %r", handler, error)
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
            self._hasher = None
        self._release_lock(failed=failed)


def _git_state() -> dict[str, Any] | None:
    """The commit (and whether the work tree had changes) when run inside a git repo."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def _versions(backend: Backend) -> dict[str, str]:
    found = {"python": platform.python_version(), backend.name: backend.version}
    for dist in ("baton-core", "baton-callbacks", "baton-backends", "torch", "jax", "lightning"):
        if (installed := installed_version(dist)) is not None:
            found[dist] = installed
    return found


def _check_limits(
    max_steps: int | None,
    max_tokens: int | None,
    max_time_s: float | None,
    log_every: int,
    eval_every: int | None,
) -> None:
    """Reject impossible loop settings before anything is created."""
    if max_steps is None and max_tokens is None and max_time_s is None:
        raise UsageError("set at least one of max_steps, max_tokens, max_time_s")
    for name, value, least in (
        ("max_steps", max_steps, 0),
        ("max_tokens", max_tokens, 0),
        ("log_every", log_every, 1),
        ("eval_every", eval_every, 1),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"{name} must be a whole number, got {value!r}")
        if value is not None and value < least:
            raise UsageError(f"{name} must be >= {least}, got {value}")
    if max_time_s is not None and not max_time_s > 0:
        raise UsageError(f"max_time_s must be > 0 seconds, got {max_time_s}")


def _error_summary(error: BaseException, limit: int = 600) -> str:
    """``Type: message`` of a load error, its innermost line when the message is a
    multi-line report (a traceback text gathered from several ranks)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", line)]
    text = named[-1] if named else f"{type(error).__name__}: {lines[-1] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
