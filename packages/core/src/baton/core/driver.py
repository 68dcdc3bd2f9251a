"""The loop driver: one loop for every backend, readable in ``Driver.fit``.

Example::

    from baton.core import Driver
    from baton.backends.fabric import FabricBackend

    backend = FabricBackend(model=net, optimizer=make_optimizer, data=loader)
    driver = Driver(backend, callbacks=[...], max_steps=100,
                    run_dir="runs/quickstart", resume="auto")
    result = driver.fit()
    print(result.stop_reason, result.step)

This file is the loop: the step, log and eval cadence, the control flags and the
limits. Beside it, each behind a small interface the loop calls:

- ``options.RunOptions``: the run's options, one dataclass checked once;
- ``startup``: the checks before anything is built (restart, launch, patches, lock);
- ``checkpoint_manager.CheckpointManager``: what a save records and a load restores
  of the run (counters, callback states), over ``saving.CheckpointSaver`` (writing
  checkpoints, sync or async, and completing them) and ``resuming.Resumer`` (choosing,
  verifying and loading the checkpoint to continue from; the changed-settings policy);
- ``reporting``: a log step's metrics in one host transfer, and an evaluation;
- ``rollouts.collaborator.Rollouts``: on a run that trains on rollouts (online RL), the
  rollout phase called before each step, its records handed to ``on_rollout_end``;
- ``shutdown``: the end of a run, cleanly or after an error;
- ``run_record``: ``run.json`` and ``patches.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from baton.core.abilities import Ability
from baton.core.backend import Backend, DataExhausted
from baton.core.callback import Callback
from baton.core.checkpoints.files import checkpoints_dir
from baton.core.checkpoints.manager import CheckpointManager, RunCounters
from baton.core.checkpoints.resuming import Resumer
from baton.core.checkpoints.run_record import write_patch_report, write_run_record
from baton.core.checkpoints.rundir import RunDirLock
from baton.core.control import Control
from baton.core.dispatch import Dispatcher
from baton.core.driver_view import DriverView
from baton.core.errors import UsageError
from baton.core.metrics import StepOutput
from baton.core.options import OptionKeywords, RunOptions
from baton.core.patches import PatchDecision
from baton.core.reporting import LogValues, evaluate
from baton.core.rollouts.collaborator import Rollouts
from baton.core.shutdown import end_run
from baton.core.startup import check_needs, prepare, setup_backend

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
    checkpoints: list[Path] = field(default_factory=list[Path])

    @classmethod
    def of(cls, driver: Driver) -> RunResult:
        """The result of ``driver``'s run as it stands."""
        return cls(
            step=driver.step,
            tokens=driver.tokens,
            samples=driver.samples,
            train_time_s=driver.train_time_s,
            stop_reason=driver.stop_reason,
            resumed_from=driver.resumed_from,
            checkpoints=list(driver.saved),
        )


class Driver:
    """Owns the training loop; the backend supplies one optimizer step at a time.

    Args:
        backend: a ``Backend`` (its native ``config`` is editable in ``on_configure``).
        callbacks: callbacks and patches; registered patches of the backend are added.
        options: the run's ``RunOptions`` (``baton.core.options``), or give them as
            keywords: ``max_steps`` / ``max_tokens`` / ``max_time_s`` (stop when any is
            reached), ``log_every``, ``eval_every``, ``run_dir``, ``resume`` (``"none"``,
            ``"auto"`` or a checkpoint path), ``patches``, ``settings`` (the recipe's
            parameters), ``save_on_stop``, ``async_save``, ``verify``, ``overwrite``,
            ``allow_changed``, ``training_settings``; ``RunOptions`` says what each does.
        rollouts: on a run that trains on rollouts (online RL), the rollout phase
            (``baton.core.rollouts.collaborator.Rollouts``): called before each
            ``train_step``, its new records handed to ``on_rollout_end``, its metrics
            logged with the step's (and ``timing/train_s``, the step's own seconds), its
            state saved in every checkpoint.

    Options are read as ``driver.options.max_steps``; ``driver.options.replace(...)``
    gives a checked copy to assign back.
    The run directory is locked for the run: a second run on it fails naming the holder.

    A callback's hooks receive the driver typed as ``DriverView`` (``driver_view.py``):
    the part of it they may read and call, which this class satisfies.

    Callbacks that own the save policy (``Checkpoint``) set it through
    ``configure_saving`` in ``on_configure``; a guard that must not let a broken state
    be saved calls ``control.veto_save``; a rollback is ``rollback(path)``.
    """

    def __init__(
        self,
        backend: Backend,
        callbacks: Sequence[Callback] = (),
        *,
        options: RunOptions | None = None,
        rollouts: Rollouts | None = None,
        **keywords: Unpack[OptionKeywords],
    ) -> None:
        if options is not None and keywords:
            raise TypeError(f"give the options as options= or as keywords, not both: {keywords}")
        self.options = options if options is not None else RunOptions.from_keywords(**keywords)
        self.backend = backend
        self.callbacks: list[Callback] = list(callbacks)
        #: the rollout phase of a run that trains on rollouts, else ``None``
        self.rollouts = rollouts
        self.control = Control()
        #: step, tokens, samples and training time: saved in each checkpoint
        self.counters = RunCounters()
        #: wall time this process spent in evaluation (for honest throughput)
        self.eval_time_s = 0.0
        self.stop_reason = ""
        self.patch_report: list[PatchDecision] = []
        self._log_values = LogValues()
        #: when training time started counting, less the training time before it
        self._clock_start = 0.0
        self._dispatch = Dispatcher([])
        self._abilities: frozenset[Ability] = frozenset()
        self._training = False
        #: True in ``evaluate_checkpoint``: nothing is trained (no progress to show)
        self.evaluating_only = False
        self._lock: RunDirLock | None = None
        self._checkpoints = self._checkpoint_manager(Resumer(backend, self.options))

    # -- what callbacks read and call ---------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self.counters.step

    @step.setter
    def step(self, value: int) -> None:
        self.counters.step = value

    @property
    def tokens(self) -> int:
        """Tokens trained on, over every rank."""
        return self.counters.tokens

    @tokens.setter
    def tokens(self, value: int) -> None:
        self.counters.tokens = value

    @property
    def samples(self) -> int:
        """Samples trained on, over every rank."""
        return self.counters.samples

    @samples.setter
    def samples(self, value: int) -> None:
        self.counters.samples = value

    @property
    def train_time_s(self) -> float:
        """Wall time spent training (evaluation and the time before a resume's load not
        counted twice)."""
        return self.counters.train_time_s

    @train_time_s.setter
    def train_time_s(self, value: float) -> None:
        self.counters.train_time_s = value

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this run resumed from (its callback states restored), or
        ``None``; a callback reads its own files there in ``on_load_checkpoint``."""
        return self._checkpoints.resumed_from

    @property
    def checkpoint_being_written(self) -> Path | None:
        """The directory of the checkpoint being written, for ``on_save_checkpoint``: a
        callback writes state too large for ``baton.json`` there, in a folder of its own
        beside ``backend/`` (``EMA`` writes ``ema/``); on resume it reads it back from
        ``resumed_from``. ``None`` before the first save."""
        return self._checkpoints.saver.writing

    @property
    def saved(self) -> list[Path]:
        """The checkpoints this run completed, oldest first."""
        return self._checkpoints.saver.saved

    @property
    def save_blocking_s(self) -> float:
        """Wall time this process spent blocked in checkpoint saves (an async save's
        background write is not counted), for honest throughput."""
        return self._checkpoints.saver.blocking_s

    @property
    def checkpoint_dir(self) -> Path:
        return checkpoints_dir(self.options.run_dir)

    @property
    def log_dir(self) -> Path:
        return self.options.run_dir / "logs"

    @property
    def is_global_zero(self) -> bool:
        return self.backend.rank == 0

    @property
    def abilities(self) -> frozenset[Ability]:
        """The backend's optional abilities (known after ``backend.setup``)."""
        return self._abilities

    def record(self, name: str, value: Any) -> None:
        """Add a lazy value to the next log step's single host transfer."""
        self._log_values.record(name, value)

    def dispatch(self, hook: str, *args: Any) -> None:
        """Call ``hook(driver, *args)`` on every callback that overrides it, in order."""
        handlers = self._dispatch.table[hook]
        if handlers:  # most hooks have none: nothing more is built or called
            view: DriverView = self  # what hooks may use of the driver (checked statically)
            args = (view, *args)
            for handler in handlers:
                handler(*args)

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
        changes = {"save_on_stop": on_stop, "async_save": asynchronous}
        self.options = self.options.replace(**{k: v for k, v in changes.items() if v is not None})

    # -- the loop ---------------------------------------------------------------------
    def fit(self) -> RunResult:
        """Run training to a stop condition; always tears down, even when it raises."""
        with self._running():
            self.dispatch("on_configure")
            setup_backend(self.backend, self.options)
            self._abilities = check_needs(self.backend, self.options, self.callbacks)
            write_patch_report(
                self.options.run_dir, self.backend, self.patch_report, write=self.is_global_zero
            )
            self.dispatch("on_setup")
            self._checkpoints.resume(evaluating=False)
            if self.is_global_zero:
                write_run_record(
                    self.options.run_dir,
                    options=self.options,
                    backend=self.backend,
                    callbacks=self.callbacks,
                    resumed_from=self.resumed_from,
                )
            self._start_clock()
            self._training = True
            self.dispatch("on_train_start")
            while not self._limit_reached_before_step():
                self.dispatch("on_step_start")
                if self.rollouts is not None:
                    self._roll_out(self.rollouts)
                try:
                    output = self._train_step()
                except DataExhausted as end:
                    self._stop_at_data_end(str(end))
                    break
                self.step += 1
                self.tokens += output.tokens
                self.samples += output.samples
                self.train_time_s = time.monotonic() - self._clock_start
                self.control.request_stop_at_limits(
                    self.options, self.step, self.tokens, self.train_time_s
                )
                self.dispatch("on_step_end", output)
                at_log_step = self.step % self.options.log_every == 0
                if self._handle_events(output, at_log_step):
                    break
                self._checkpoints.saver.poll(block=False, agree=at_log_step)
            self._checkpoints.saver.poll(block=True)
            self.dispatch("on_train_end")
        return RunResult.of(self)

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]:
        """Evaluation only: build the backend, load the checkpoint at ``path`` (verified
        like a resume; settings may differ, nothing is trained), evaluate once and hand
        the metrics to the callbacks (``on_eval_end``: loggers write them at the
        checkpoint's step). Nothing is trained or saved.

        Example::

            metrics = driver.evaluate_checkpoint("runs/quickstart/checkpoints/latest")
            metrics["eval/loss"]
        """
        # the weights are evaluated as they are: changed settings need no applying
        self.options = self.options.replace(resume=str(path), allow_changed={"all"})
        self.evaluating_only = True
        with self._running():
            self.dispatch("on_configure")
            setup_backend(self.backend, self.options)
            self.dispatch("on_setup")
            self._checkpoints.resume(evaluating=True)
            self.dispatch("on_train_start")
            metrics = self._evaluate()
            self.stop_reason = f"evaluated {path}"
            self.dispatch("on_train_end")
        return metrics

    def _roll_out(self, rollouts: Rollouts) -> None:
        """The next step's rollouts (``rollouts.before_step``): their metrics go to the
        step's log values, new records to ``on_rollout_end``."""
        outcome = rollouts.before_step(self.step + 1)
        for name, value in outcome.metrics.items():
            self.record(name, value)
        if outcome.records is not None:
            self.dispatch("on_rollout_end", outcome.records)

    def _train_step(self) -> StepOutput:
        """The backend's step; on a rollout run its host seconds are ``timing/train_s``."""
        if self.rollouts is None:
            return self.backend.train_step(self.step + 1)
        started = time.perf_counter()
        output = self.backend.train_step(self.step + 1)
        self.record("timing/train_s", time.perf_counter() - started)
        return output

    def _handle_events(self, output: StepOutput, at_log_step: bool) -> bool:
        """Log, evaluate, save (last), then stop: returns True when the loop must end."""
        ctl = self.control
        eval_every = self.options.eval_every
        eval_due = bool(eval_every) and self.step % eval_every == 0
        if not (at_log_step or eval_due) and ctl.idle:
            return False  # nothing to log, evaluate, save or stop at this step
        ranks = self.backend.world_size
        acting = ctl.acting(
            ranks=ranks, agree=self.backend.all_reduce_flags if at_log_step else None
        )
        if "log" in acting or at_log_step:
            counters = {"tokens": self.tokens, "samples": self.samples}
            metrics = self._log_values.fetch(
                self.backend, output, **counters, train_time_s=self.train_time_s
            )
            self.dispatch("on_log", metrics)
        if "eval" in acting or eval_due:
            started = time.perf_counter()
            self._evaluate()
            self.eval_time_s += time.perf_counter() - started
        acting = ctl.acting_after_events(acting, ranks=ranks)
        stop = "stop" in acting
        if ctl.save_vetoed is None and ("save" in acting or (stop and self.options.save_on_stop)):
            self.save_checkpoint(ctl.reason("save") or f"stop: {ctl.reason('stop')}")
        if stop:
            self.stop_reason = ctl.reason("stop")
            log.info("stopping at step %d: %s", self.step, self.stop_reason)
        ctl.clear(acting)
        return stop

    def _stop_at_data_end(self, reason: str) -> None:
        self.stop_reason = reason
        log.info("stopping after step %d: %s", self.step, reason)
        if self.options.save_on_stop and self.step > 0:
            self.save_checkpoint(f"stop: {reason}")

    # -- stop conditions -----------------------------------------------------------------
    def _limit_reached_before_step(self) -> bool:
        """A step or token limit already reached (a resumed run, a zero limit)."""
        reasons = self.options.limits_reached(self.step, self.tokens)
        if reasons:
            self.stop_reason = self.stop_reason or reasons[0]
        return bool(reasons)

    # -- log and eval: ``reporting`` -----------------------------------------------------
    def _evaluate(self) -> dict[str, float]:
        return evaluate(self.backend, self.dispatch)

    # -- checkpoints: CheckpointManager (``checkpoint_manager``) -------------------------
    def save_checkpoint(self, reason: str = "requested") -> None:
        """Write a checkpoint of the current step now (``control.request_save`` defers it),
        in the background where the run asked for it and the backend has ``async_save``."""
        self._checkpoints.save(
            reason,
            self.options,
            patches=[decision.name for decision in self.patch_report if decision.applied],
            asynchronous=self.options.async_save and "async_save" in self._abilities,
        )

    def wait_for_saves(self) -> None:
        """Block until every checkpoint still being written is complete (renamed,
        ``latest`` updated, ``on_checkpoint_saved`` called). Call it on every rank."""
        self._checkpoints.saver.poll(block=True)

    def load_checkpoint(self, path: str | Path | None = None, *, callbacks: bool = False) -> Path:
        """Restore a complete checkpoint in the middle of a run (a rollback).

        ``path=None`` takes the newest complete one. The backend state (weights,
        optimizer, data position, RNG) and the step, token and time counters come back;
        callback states only with ``callbacks=True`` (a guard that rolls back keeps its
        own memory of why). Call it from ``on_step_start``: the next step is then the
        one after the checkpoint's. Raises ``CheckpointError`` when none can be loaded.
        """
        loaded = self._checkpoints.load(None if path is None else Path(path), callbacks=callbacks)
        self._start_clock()
        return loaded

    def rollback(self, path: str | Path) -> Path:
        """Go back to the complete checkpoint ``path``, abandoning what came after it.

        Checkpoints newer than ``path`` belong to the abandoned timeline: they are
        deleted and ``latest`` points at ``path`` again (on rank 0, between barriers);
        then the backend state and the counters come back as in ``load_checkpoint``
        (callback states stay). Call it from ``on_step_start``.
        """
        loaded = self._checkpoints.rollback(Path(path))
        self._start_clock()
        return loaded

    def _start_clock(self) -> None:
        self._clock_start = time.monotonic() - self.train_time_s

    # -- start and end ----------------------------------------------------------------
    def _prepare(self) -> None:
        """Every check before the backend builds anything (``startup.prepare``)."""
        start = prepare(self.backend, self.callbacks, self.options, evaluating=self.evaluating_only)
        self.options, self.callbacks = start.options, start.callbacks
        self.patch_report, self._lock = start.patch_report, start.lock
        self._dispatch = Dispatcher(self.callbacks)
        self._checkpoints = self._checkpoint_manager(start.resumer)

    def _checkpoint_manager(self, resumer: Resumer) -> CheckpointManager:
        """The run's checkpoints, handed the backend, the counters, the callbacks and
        the hooks."""
        return CheckpointManager(
            self.backend,
            self.checkpoint_dir,
            resumer,
            counters=self.counters,
            callbacks=self.callbacks,
            dispatch=self.dispatch,
            rollouts=self.rollouts,
        )

    @contextmanager
    def _running(self) -> Generator[None]:
        """Prepare, run the body, and always tear down; an error first finishes the
        saves in flight and reaches ``on_exception``."""
        self._prepare()
        try:
            yield
        except BaseException as error:
            self.stop_reason = self.stop_reason or f"error: {type(error).__name__}: {error}"
            self._end(error)
            raise
        self._end()

    def _guarded_hooks(self, hook: str, *args: Any) -> None:
        """``hook(driver, *args)`` on each callback overriding it; an error is logged and
        the next one runs (``shutdown``)."""
        self._dispatch.call_each_guarded(hook, self, *args)

    def _end(self, error: BaseException | None = None) -> None:
        """Tear down (``shutdown.end_run``), then release the run directory."""
        end_run(self.backend, self._checkpoints.saver, self._guarded_hooks, error)
        if self._lock is not None:  # a run that failed at once leaves no run directory
            # bad input found before the first step ended (a reward function that raises
            # on the first rollouts) is refused like bad input found before training
            refused = isinstance(error, UsageError) and (not self._training or self.step == 0)
            self._lock.release(remove_if_unused=error is not None, remove_created=refused)
            self._lock = None
