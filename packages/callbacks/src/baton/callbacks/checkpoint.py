"""Periodic checkpoints with rotation: keep the last k, and optionally the best k.

Example::

    from baton.callbacks import Checkpoint

    Driver(backend, callbacks=[
        Checkpoint(every_n_steps=500, every_minutes=30, keep_last=2,
                   keep_best=1, monitor="eval/loss", mode="min", async_save=True),
    ], run_dir="runs/x", resume="auto")

The driver writes each checkpoint under a temporary name, renames it when complete
and only then points ``checkpoints/latest`` at it; this callback decides *when* to
save and, once a save is complete, which older checkpoints to delete (on rank 0;
``on_checkpoint_removed`` then tells callbacks that keep copies, ``CheckpointUpload``).
It never deletes the newest complete checkpoint or a kept best one, and a save that
fails part-way deletes nothing. The kept list and best scores travel in every
checkpoint, so rotation carries on correctly after a resume.

The save policy (``save_on_stop``, ``async_save``) is handed to the driver in
``on_configure`` (``driver.configure_saving``). With ``async_save=True`` the backend
writes in the background where it has the ``async_save`` ability; the step loop
continues meanwhile.

``monitor`` is read from evaluation results (``on_eval_end``) when it starts with
``eval/`` or evaluation carries it under its author's name (a LightningModule's
``val_loss``), else from training metrics (``on_log``); a key missing from the first
metrics of its phase stops the run with an error listing the keys that exist
(``baton.callbacks.metric_keys``).

Metric keys logged: none (``checkpoint_score`` is recorded in ``baton.json``).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from baton.callbacks.metric_keys import Monitored, evaluation_may_name
from baton.core.callback import CHECKPOINT_PRIORITY, Callback
from baton.core.checkpoints import files as ckpt
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import Ability, DriverView, StepOutput

log = logging.getLogger("baton")


@CALLBACKS.register("checkpoint")
class Checkpoint(Callback):
    """Save every N steps / T minutes and at the end; keep the last k and the best k.

    Args:
        every_n_steps: save when ``step % every_n_steps == 0`` (``None``: not by steps).
        every_minutes: save when this much wall time passed since the last save.
        save_on_stop: save when the run stops (end of training, preemption, limits).
        keep_last: how many of the newest checkpoints to keep (``None``: all).
        keep_best: additionally keep this many best checkpoints by ``monitor``.
        monitor: metric whose latest value scores a checkpoint (``eval/loss``: the
            latest evaluation's; ``loss``: the latest log step's).
        mode: ``"min"`` or ``"max"``: which scores are better.
        async_save: let the backend write in the background where it can.
    """

    state_key = "checkpoint"
    priority = CHECKPOINT_PRIORITY

    def __init__(
        self,
        every_n_steps: int | None = None,
        every_minutes: float | None = None,
        *,
        save_on_stop: bool = True,
        keep_last: int | None = 2,
        keep_best: int = 0,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        async_save: bool = False,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}")
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"every_minutes must be > 0 or None, got {every_minutes}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(
                f"keep_last must be >= 1 or None (keep all), got {keep_last}: the newest "
                "complete checkpoint is always kept"
            )
        if keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {keep_best}")
        if keep_best and not monitor:
            raise ValueError("keep_best needs monitor=<metric key>, e.g. monitor='eval/loss'")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.every_n_steps = every_n_steps
        self.every_minutes = every_minutes
        self.save_on_stop = save_on_stop
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.monitor = monitor
        self.mode = mode
        self.async_save = async_save
        self._monitored = Monitored(monitor, "Checkpoint") if monitor else None
        #: complete checkpoints this run knows of, oldest first (directory names)
        self.kept: list[str] = []
        #: monitored score of each kept checkpoint that had one
        self.scores: dict[str, float] = {}
        self._value: float | None = None
        self._last_save = 0.0
        self._pending_scores: dict[str, float] = {}

    # -- state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "kept": list(self.kept),
            "scores": dict(self.scores),
            "monitor": self.monitor,
            "mode": self.mode,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kept = list(state.get("kept", []))
        scores = dict(state.get("scores", {}))
        if (state.get("monitor"), state.get("mode")) != (self.monitor, self.mode) and scores:
            log.warning(
                "checkpoint scores were kept by %s (%s); this run monitors %s (%s): "
                "earlier best checkpoints are no longer protected",
                state.get("monitor"),
                state.get("mode"),
                self.monitor,
                self.mode,
            )
            scores = {}
        self.scores = scores

    def requires(self) -> frozenset[Ability]:
        monitored = self._monitored
        return frozenset({"evaluate"}) if monitored and monitored.phase == "eval" else frozenset()

    def __repr__(self) -> str:
        return f"Checkpoint(every_n_steps={self.every_n_steps}, monitor={self.monitor!r})"

    # -- hooks ----------------------------------------------------------------------
    def on_configure(self, driver: DriverView) -> None:
        driver.configure_saving(on_stop=self.save_on_stop, asynchronous=self.async_save)

    def on_train_start(self, driver: DriverView) -> None:
        self._last_save = time.monotonic()
        if driver.is_global_zero:
            _remove_stale_temporaries(driver.checkpoint_dir)

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        # on resume and on rollback: the restored checkpoint is complete; what is newer
        # belongs to an abandoned timeline and what is gone from disk is forgotten
        restored = ckpt.checkpoint_name(int(checkpoint["step"]))
        self.kept = [
            n
            for n in self.kept
            if (driver.checkpoint_dir / n).is_dir() and _step(n) <= int(checkpoint["step"])
        ]
        if restored not in self.kept:
            self.kept.append(restored)
        self.kept.sort(key=_step)
        self.scores = {n: s for n, s in self.scores.items() if n in self.kept}

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if self.every_n_steps and driver.step % self.every_n_steps == 0:
            driver.control.request_save(f"every {self.every_n_steps} steps", all_ranks=True)
        if self.every_minutes and time.monotonic() - self._last_save >= self.every_minutes * 60:
            # wall clocks differ across ranks: agreed at the next log step
            driver.control.request_save(f"every {self.every_minutes:g} minutes")

    def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self._monitored is not None:
            value = self._monitored.read(
                "train", driver.step, metrics, named_eval=evaluation_may_name(driver)
            )
            self._value = value if value is not None else self._value

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self._monitored is not None:
            value = self._monitored.read("eval", driver.step, metrics)
            self._value = value if value is not None else self._value

    def on_save_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        self._last_save = time.monotonic()
        name = ckpt.checkpoint_name(driver.step)
        score = self._value if self._value is not None and math.isfinite(self._value) else None
        if self.monitor:
            checkpoint["checkpoint_score"] = {self.monitor: score}
        # the state saved in this checkpoint already counts it: if it is ever loaded,
        # it was complete
        state = checkpoint["callbacks"][self.state_key]
        state["kept"] = [n for n in state["kept"] if n != name] + [name]
        if score is not None:
            state["scores"][name] = score
            self._pending_scores[name] = score

    def on_checkpoint_saved(self, driver: DriverView, path: Path) -> None:
        name = path.name
        self.kept = [n for n in self.kept if n != name] + [name]
        if name in self._pending_scores:
            self.scores[name] = self._pending_scores.pop(name)
        self._rotate(driver)

    # -- rotation -------------------------------------------------------------------
    def protected(self) -> set[str]:
        """Names rotation must keep: the newest, the last ``keep_last``, the best."""
        keep: set[str] = {self.kept[-1]} if self.kept else set()
        keep.update(self.kept if self.keep_last is None else self.kept[-self.keep_last :])
        if self.keep_best:
            ranked = sorted(
                (n for n in self.kept if n in self.scores),
                key=lambda n: self.scores[n],
                reverse=self.mode == "max",
            )
            keep.update(ranked[: self.keep_best])
        return keep

    def _rotate(self, driver: DriverView) -> None:
        keep = self.protected()
        latest = ckpt.latest(driver.checkpoint_dir)
        if latest is not None:
            keep.add(latest.name)
        for name in [n for n in self.kept if n not in keep]:
            self.kept.remove(name)
            self.scores.pop(name, None)
            path = driver.checkpoint_dir / name
            if driver.is_global_zero and path.is_dir():
                ckpt.remove_checkpoint(path)
                log.info("removed old checkpoint %s", path)
            driver.dispatch("on_checkpoint_removed", path)  # copies elsewhere follow


def _step(name: str) -> int:
    return ckpt.checkpoint_step(Path(name)) or 0


def _remove_stale_temporaries(root: Path) -> None:
    """Leftovers of saves or deletions a crash interrupted (never loaded; only space)."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.name.startswith(ckpt.TMP_PREFIX) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed unfinished checkpoint directory %s", path)
