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
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from baton.core import checkpointing as ckpt
from baton.core.backend import Backend, DataExhausted, PendingSave
from baton.core.callback import Callback
from baton.core.control import Control
from baton.core.dispatch import Dispatcher
from baton.core.metrics import StepOutput
from baton.core.patches import PatchDecision, select_patches

log = logging.getLogger("baton")


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


class Driver:
    """Owns the training loop; the backend supplies one optimizer step at a time.

    Args:
        backend: a ``Backend`` (its native ``config`` is editable in ``on_configure``).
        callbacks: callbacks and patches; registered patches of the backend are added.
        max_steps / max_tokens / max_time_s: stop conditions (any that is set).
        log_every: the log cadence; metrics reach the host only on log steps.
        eval_every: evaluate every N steps (``None``: only when a callback asks).
        run_dir: where checkpoints and logs go (``runs/<name>``).
        resume: ``"none"``, ``"auto"`` (newest complete checkpoint, if any) or a path.
        patches: patch selection (``all``, ``none``, ``a,b``, ``all,-a``);
            ``None`` reads ``BATON_PATCHES``.
        settings: the recipe's parameters, recorded in each checkpoint.
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
    ) -> None:
        if max_steps is None and max_tokens is None and max_time_s is None:
            raise ValueError("set at least one of max_steps, max_tokens, max_time_s")
        if log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
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

        self.control = Control()
        #: write a checkpoint whenever the run stops (the Checkpoint callback sets it)
        self.save_on_stop = False
        #: save asynchronously where the backend supports it
        self.async_save = False

        self.step = 0
        self.tokens = 0
        self.samples = 0
        self.train_time_s = 0.0
        self.last_output: StepOutput | None = None
        self.last_metrics: dict[str, float] = {}
        self.stop_reason = ""
        self.resumed_from: Path | None = None
        self.patch_report: list[PatchDecision] = []
        self.saved: list[Path] = []
        self._extra_lazy: dict[str, Any] = {}
        self._pending: list[_PendingCheckpoint] = []
        self._clock_start = 0.0
        self._time_before = 0.0
        self._dispatch = Dispatcher([])

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

    # -- the loop ---------------------------------------------------------------------
    def fit(self) -> RunResult:
        """Run training to a stop condition; always tears down, even when it raises."""
        self._prepare()
        try:
            self.dispatch("on_configure")
            self.backend.setup()
            self._write_patch_report()
            self.dispatch("on_setup")
            self._resume()
            self._clock_start = time.monotonic()
            self._time_before = self.train_time_s
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
                self.last_output = output
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
            raise
        finally:
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
        """Evaluation only: build the backend, load the checkpoint at ``path``, evaluate
        once and hand the metrics to the callbacks (``on_eval_end``, ``on_log``: loggers
        write them at the checkpoint's step). Nothing is trained or saved.

        Example::

            metrics = driver.evaluate_checkpoint("runs/quickstart/checkpoints/latest")
            metrics["eval/loss"]
        """
        path = Path(path)
        meta = ckpt.read_meta(path)
        self._prepare()
        try:
            self.dispatch("on_configure")
            self.backend.setup()
            self._check_compatible(path, meta)
            self.backend.load(path / ckpt.BACKEND_DIR)
            self.step, self.tokens = int(meta["step"]), int(meta["tokens"])
            self.samples = int(meta.get("samples", 0))
            self.dispatch("on_train_start")
            metrics = self._evaluate()
            self.stop_reason = f"evaluated {path}"
            self.dispatch("on_train_end")
        finally:
            self._teardown()
        return metrics

    def _handle_events(self, output: StepOutput) -> bool:
        """Log, evaluate, save (last), then stop: returns True when the loop must end."""
        acting = self._actionable_flags()
        if "log" in acting or self.step % self.log_every == 0:
            self._log(output)
        if "eval" in acting or (self.eval_every and self.step % self.eval_every == 0):
            self._evaluate()
        acting = self._after_log_and_eval(acting)
        stop = "stop" in acting
        if "save" in acting or (stop and self.save_on_stop):
            self._save(self.control.reason("save") or f"stop: {self.control.reason('stop')}")
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

    # -- log and eval -----------------------------------------------------------------
    def _log(self, output: StepOutput) -> None:
        lazy = output.lazy_values()
        lazy.update(self._extra_lazy)
        self._extra_lazy = {}
        metrics = self.backend.fetch(lazy)
        metrics.update(
            tokens=float(self.tokens), samples=float(self.samples), train_time_s=self.train_time_s
        )
        self.last_metrics = metrics
        self.dispatch("on_log", metrics)

    def _evaluate(self) -> dict[str, float]:
        self.dispatch("on_eval_start")
        values = self.backend.fetch(dict(self.backend.evaluate()))
        metrics = {k if k.startswith("eval/") else f"eval/{k}": v for k, v in values.items()}
        self.dispatch("on_eval_end", metrics)
        self.dispatch("on_log", dict(metrics))
        return metrics

    # -- checkpoints ------------------------------------------------------------------
    def _checkpoint_meta(self, reason: str) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for cb in self.callbacks:
            if cb.state_key is not None:
                states[cb.state_key] = cb.state_dict()
        return {
            "format": 1,
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
            "patches": [d.name for d in self.patch_report if d.applied],
            "versions": _versions(self.backend),
        }

    def save_checkpoint(self, reason: str = "requested") -> None:
        """Write a checkpoint of the current step now (``control.request_save`` defers it)."""
        self._save(reason)

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
        asynchronous = self.async_save and getattr(self.backend, "supports_async_save", False)
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
            if item.handle is not None and not block and not self._all_written(item, multi):
                return
            self._pending.pop(0)
            if item.handle is not None:
                try:
                    item.handle.wait()
                except BaseException:
                    if self.is_global_zero:
                        shutil.rmtree(item.tmp, ignore_errors=True)
                    raise
            if item.handle is None or multi:
                self.backend.barrier()
            if self.is_global_zero:
                ckpt.finalize(item.tmp, item.final, item.meta)
                log.info("checkpoint %s saved (%s)", item.final, item.meta["reason"])
            if item.handle is None or multi:
                self.backend.barrier()
            self.saved.append(item.final)
            self.dispatch("on_checkpoint_saved", item.final)

    def _all_written(self, item: _PendingCheckpoint, multi: bool) -> bool:
        assert item.handle is not None
        if not multi:
            return item.handle.done()
        if self.step % self.log_every != 0:
            return False  # ranks agree only at the log cadence: no collective per step
        unfinished = self.backend.all_reduce_flags([not item.handle.done()])
        return not unfinished[0]

    def _resume(self) -> None:
        if self.resume in (None, "", "none"):
            return
        if str(self.resume) == "auto":
            candidates = ckpt.resumable(self.checkpoint_dir)
            if not candidates:
                log.info(
                    "resume=auto: no complete checkpoint in %s, starting fresh", self.checkpoint_dir
                )
                return
        else:
            path = Path(self.resume)
            candidates = [(path, ckpt.read_meta(path))]
        errors: list[str] = []
        for path, meta in candidates:
            self._check_compatible(path, meta)
            try:
                self.backend.load(path / ckpt.BACKEND_DIR)
            except Exception as error:  # a corrupt checkpoint: try the previous one
                errors.append(f"{path}: {type(error).__name__}: {error}")
                log.warning("could not load checkpoint %s (%s); trying an older one", path, error)
                continue
            self._restore(path, meta)
            return
        raise ckpt.CheckpointError("no checkpoint could be loaded:\n  " + "\n  ".join(errors))

    def load_checkpoint(self, path: str | Path | None = None, *, callbacks: bool = False) -> Path:
        """Restore a complete checkpoint in the middle of a run (a rollback).

        ``path=None`` takes the newest complete one. The backend state (weights,
        optimizer, data position, RNG) and the step, token and time counters come back;
        callback states only with ``callbacks=True`` (a guard that rolls back keeps its
        own memory of why). Call it from ``on_step_start``: the next step is then the
        one after the checkpoint's. Raises ``CheckpointError`` when none can be loaded.
        """
        if path is None:
            candidates = ckpt.resumable(self.checkpoint_dir)
            if not candidates:
                raise ckpt.CheckpointError(f"no complete checkpoint in {self.checkpoint_dir}")
            path, meta = candidates[0]
        else:
            path = Path(path)
            meta = ckpt.read_meta(path)
        self._poll_pending(block=True)
        self._check_compatible(path, meta)
        self.backend.load(path / ckpt.BACKEND_DIR)
        self._restore(path, meta, callbacks=callbacks)
        self._clock_start = time.monotonic()
        self._time_before = self.train_time_s
        return path

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
        patches, self.patch_report = select_patches(self.backend, self.patch_selection)
        user = [cb for cb in self.callbacks if not any(type(cb) is type(p) for p in patches)]
        self.callbacks = [*patches, *user]
        keys = [cb.state_key for cb in self.callbacks if cb.state_key is not None]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"callbacks share state_key {duplicates}: give each stateful callback a unique "
                "state_key so checkpoints can tell their states apart"
            )
        self._dispatch = Dispatcher(self.callbacks)

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

    def _teardown(self) -> None:
        try:
            self.backend.teardown()
        except Exception as error:
            log.error("backend teardown raised %r", error)
        for handler in self._dispatch.handlers("on_teardown"):
            try:
                handler(self)
            except Exception as error:
                log.error("on_teardown handler %r raised %r", handler, error)


def _versions(backend: Backend) -> dict[str, str]:
    found = {"python": platform.python_version(), backend.name: backend.version}
    for dist in ("baton-core", "baton-callbacks", "baton-backends", "torch", "jax", "lightning"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return found
