"""Continuing a run: which checkpoint, whether it can be trusted, what may have changed
since it was written, and who applies each allowed change.

The driver calls a ``Resumer`` at three moments::

    resumer = Resumer(backend, options)
    resumer.check_request()            # before the lock: the named checkpoint exists
    resumer.plan(rank_zero=True)       # before setup: refuse or move aside old
                                       #   checkpoints, verify the first candidate and
                                       #   refuse changed settings nobody can apply
    loaded = resumer.resume()          # after setup: with several ranks, check they
                                       #   planned the same checkpoint; load it (older
                                       #   ones as fallbacks), the backend re-applies
                                       #   allowed changes
    path, meta = loaded                # the driver restores its counters and callbacks

Mid-run, ``load(path)`` restores a complete checkpoint (a rollback) and ``rewind(path)``
deletes the checkpoints of the abandoned timeline first.

The policy on changed settings (``resume_settings``): a training setting that differs
from the checkpoint's is refused unless ``allow_changed`` names it; an allowed one must
be applied by the backend (its ``changeable_settings``, re-applied in
``apply_changed_settings`` after ``load``) or be a driver limit (``max_steps``) that
no restored state depends on. Each allowed change is recorded in later checkpoints
(``resume_changes``, with ``applied_by``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import baton.core.checkpoints.files as ckpt
from baton.core.backend import Backend
from baton.core.callback import Callback
from baton.core.checkpoints.compatibility import as_written_by, judge, judge_recipe
from baton.core.checkpoints.rundir import set_aside
from baton.core.checkpoints.settings import (
    changed_callback_settings,
    changed_settings,
    check_changes,
)
from baton.core.errors import UsageError
from baton.core.options import RunOptions

log = logging.getLogger("baton")

#: a checkpoint and its ``baton.json``
Candidate = tuple[Path, dict[str, Any]]


class Resumer:
    """Chooses, verifies and loads the checkpoint a run continues from.

    Args:
        backend: loads the checkpoint's native state.
        options: ``resume``, ``verify``, ``overwrite``, ``allow_changed``, the settings
            and limits compared with the checkpoint's.
        evaluating: only evaluating the weights: changed settings need no applying.

    ``changes`` is the history of allowed setting changes recorded in each checkpoint.
    """

    def __init__(self, backend: Backend, options: RunOptions, *, evaluating: bool = False):
        self.backend = backend
        self.options = options
        self.evaluating = evaluating
        self.checkpoint_dir = ckpt.checkpoints_dir(options.run_dir)
        self.changes: list[dict[str, Any]] = []
        #: the verified checkpoint to load first, and the fallbacks, verified when needed
        self._first: Candidate | None = None
        self._fallbacks: list[Path] = []
        self._failures: list[str] = []
        self._allowed_now: dict[str, tuple[Any, Any]] = {}
        #: the changed callback arguments (``ema.decay``): the callback applies them
        self._callback_changes: set[str] = set()
        #: the checkpoint whose settings were checked (and their changes logged) last
        self._settings_checked: Path | None = None

    # -- before anything is built ---------------------------------------------------
    def requested_path(self) -> Path:
        """The checkpoint ``resume`` names: a path, or a name under ``checkpoints/``."""
        path = Path(self.options.resume)
        if not path.exists() and (self.checkpoint_dir / path).exists():
            path = self.checkpoint_dir / path
        return path

    def check_request(self) -> None:
        """A named checkpoint must exist (``UsageError`` naming the choices)."""
        resume = self.options.resume
        if self.options.resumes and resume != "auto" and not self.requested_path().is_dir():
            raise UsageError(
                f"resume={resume!r}: no checkpoint directory there; pass --resume auto "
                f"(the newest in {self.checkpoint_dir}) or a path like "
                f"{self.checkpoint_dir / ckpt.checkpoint_name(100)}"
            )

    def plan(self, *, rank_zero: bool) -> None:
        """Refuse to start over where checkpoints exist unless ``overwrite`` (rank 0
        moves them aside); find and verify the checkpoint to resume from and refuse
        changed settings, all before the backend builds anything."""
        if not self.options.resumes:
            self._claim(rank_zero)
            return
        if self.options.resume == "auto":
            self._fallbacks = ckpt.resume_order(self.checkpoint_dir)
            self._first = self._next_candidate()
            if self._first is None and self._failures:
                raise ckpt.CheckpointError(
                    f"resume=auto: {self.checkpoint_dir} holds checkpoints but none can be "
                    "loaded:\n  " + "\n  ".join(self._failures) + "\nrestore them, "
                    "resume from a copy with --resume PATH, or start over with --overwrite "
                    "(moves them aside)"
                )
            if self._first is None:
                log.info(
                    "resume=auto: no complete checkpoint in %s, starting fresh", self.checkpoint_dir
                )
        else:
            path = self.requested_path()
            self._first = (path, ckpt.read_meta(path, self.options.verify))
        if self._first is not None:
            self._check_settings(*self._first)

    def _claim(self, rank_zero: bool) -> None:
        existing = ckpt.list_checkpoints(self.checkpoint_dir)
        if not existing:
            return
        if not self.options.overwrite:
            raise UsageError(
                f"{self.checkpoint_dir} already holds checkpoints (newest {existing[-1].name}); "
                "continue them with --resume auto, start a new run with a fresh --run-dir, or "
                "pass --overwrite to move them aside"
            )
        if rank_zero:
            for moved in set_aside(self.options.run_dir):
                log.warning("overwrite: moved %s aside to %s", moved.name.split(".")[0], moved)

    def _next_candidate(self) -> Candidate | None:
        """The next fallback that passes verification; broken ones are warned about."""
        while self._fallbacks:
            path = self._fallbacks.pop(0)
            try:
                return path, ckpt.read_meta(path, self.options.verify)
            except ckpt.CheckpointError as error:
                log.warning("skipping checkpoint: %s", error)
                self._failures.append(str(error))
        return None

    # -- after setup ------------------------------------------------------------------
    def resume(self) -> Candidate | None:
        """Load the planned checkpoint into the backend, an older one where it fails to
        load (``auto``); ``None`` when the run starts fresh. Raises ``CheckpointError``
        when none loads."""
        self._check_ranks_agree()
        candidate, tried = self._first, False
        while candidate is not None:
            path, meta = candidate
            tried = True
            plan = judge(self.backend, path, meta)
            if path != self._settings_checked:  # the planned one was checked (and logged)
                self._check_settings(path, meta)
            try:
                self.backend.load(path / ckpt.BACKEND_DIR, plan)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as error:  # a corrupt checkpoint: try the previous one
                # (torch's CheckpointException derives from BaseException)
                reason = error_summary(error)
                self._failures.append(f"{path}: {reason}")
                log.warning("could not load checkpoint %s (%s); trying an older one", path, reason)
                candidate = self._next_candidate()
                continue
            self._apply_allowed_changes(path)
            return candidate
        if tried:
            raise ckpt.CheckpointError(
                "no checkpoint could be loaded:\n  "
                + "\n  ".join(self._failures)
                + "\nresume from another checkpoint with --resume PATH, or start over with "
                "--overwrite"
            )
        return None

    def _check_ranks_agree(self) -> None:
        """With several ranks, each planned its checkpoint from its own run directory:
        they must have planned the same step (one all-reduce of flags), or loading would
        mix states. A difference is a ``CheckpointError`` on every rank."""
        backend = self.backend
        if backend.world_size <= 1 or not self.options.resumes:
            return
        planned = self._first
        step = int(planned[1].get("step", 0)) if planned is not None else -1
        if same_on_every_rank(step + 1, backend.all_reduce_flags):
            return
        mine = f"{planned[0]} (step {step})" if planned is not None else "no checkpoint"
        raise ckpt.CheckpointError(
            f"the ranks planned to resume from different checkpoints (rank {backend.rank}: "
            f"{mine}): their run directories hold different checkpoints. Give every rank "
            "the same run directory (a shared filesystem), or keep the checkpoints in object "
            "storage too (--checkpoint-upload s3://...) so every node fetches the same one"
        )

    # -- in the middle of a run -------------------------------------------------------
    def load(self, path: Path | None) -> Candidate:
        """Verify and load a complete checkpoint (``None``: the newest one) into the
        backend; raises ``CheckpointError`` when there is none."""
        if path is None:
            candidates = ckpt.resumable(self.checkpoint_dir, self.options.verify)
            if not candidates:
                raise ckpt.CheckpointError(f"no complete checkpoint in {self.checkpoint_dir}")
            path, meta = candidates[0]
        else:
            meta = ckpt.read_meta(path, self.options.verify)
        self.backend.load(path / ckpt.BACKEND_DIR, judge(self.backend, path, meta))
        return path, meta

    def rewind(self, path: Path) -> int:
        """Make ``path`` the newest checkpoint: later ones are deleted and ``latest``
        points at it again (rank 0, then a barrier). Returns its step."""
        target = int(ckpt.read_meta(path)["step"])
        if self.backend.rank == 0:
            for later in ckpt.list_checkpoints(self.checkpoint_dir):
                if (ckpt.checkpoint_step(later) or 0) > target:
                    ckpt.remove_checkpoint(later)
            ckpt.update_latest(self.checkpoint_dir, path)
        self.backend.barrier()
        return target

    # -- what may differ ----------------------------------------------------------------
    def _check_settings(self, path: Path, meta: dict[str, Any]) -> None:
        """Refuse a resume whose training settings differ from the checkpoint's unless
        ``allow_changed`` names them; allowed changes are logged and recorded.

        Only recipe settings are compared: the driver's own limits (``max_steps`` given
        to ``Driver``) are applied by the loop as they are and logged when they differ.
        An allowed change that neither the backend nor the driver applies is refused.
        """
        self._settings_checked = path
        meta = as_written_by(self.backend, path, meta)
        options = self.options
        names = options.training_settings | self.backend.training_settings
        judge_recipe(path, meta, backend=self.backend.name, settings=options.settings)
        saved = meta.get("settings", {})
        changes = changed_settings(saved, options.settings, names)
        by_callbacks = changed_callback_settings(saved, options.settings)
        self._callback_changes = set(by_callbacks)
        changes |= by_callbacks
        allowed = check_changes(changes, set(options.allow_changed), path)
        self.changes = list(meta.get("resume_changes", []))
        self._allowed_now = allowed
        if not self.evaluating:  # refuse, before anything is built, what no one applies
            self._appliers(allowed, path)
        if allowed and not self.evaluating:  # an evaluation trains on nothing: no warning
            for name, (old, new) in allowed.items():
                log.warning(
                    "resuming with %s changed from %r to %r (allowed by allow_changed)",
                    name,
                    old,
                    new,
                )
            self.changes.append(
                {
                    "step": int(meta.get("step", 0)),
                    "changes": {k: {"checkpoint": o, "now": n} for k, (o, n) in allowed.items()},
                }
            )
        driver_limits: dict[str, Any] = meta.get("driver", {})
        for name, old in driver_limits.items():
            new = options.limits().get(name)
            if old != new:
                log.info(
                    "resuming with the driver's %s %r (the checkpoint's run had %r)", name, new, old
                )

    def _appliers(self, changes: dict[str, tuple[Any, Any]], path: Path) -> dict[str, str]:
        """Who applies each allowed change: ``"backend"`` for the settings the backend
        re-applies to the state it restores (its ``changeable_settings``), ``"driver"`` for
        the driver's own limits (``max_steps`` given to ``Driver``) that no restored state
        depends on; a change nobody applies is refused (``UsageError``)."""
        backend_names = self.backend.changeable_settings
        limits = self.options.limits()
        appliers: dict[str, str] = {}
        for name, (old, new) in changes.items():
            by_driver = name in limits and limits[name] == new
            if name in self._callback_changes:  # built with its new argument
                appliers[name] = "callback"
            elif name in backend_names:
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
        if not self._allowed_now or self.evaluating:
            return
        appliers = self._appliers(self._allowed_now, path)
        wanted = {k: v for k, v in self._allowed_now.items() if "backend" in appliers[k]}
        applied: set[str] = set()
        if wanted:
            applied = set(self.backend.apply_changed_settings(dict(wanted)))
        record: dict[str, dict[str, Any]] = self.changes[-1]["changes"]
        for name, (old, new) in self._allowed_now.items():
            if name in wanted and name not in applied:
                self._refuse_unapplied(path, name, old, new)
            record[name]["applied_by"] = appliers[name]


def same_on_every_rank(
    value: int, all_reduce_flags: Callable[[list[bool]], list[bool]], bits: int = 64
) -> bool:
    """Whether every rank passed the same ``value`` (``0 <= value < 2**bits``), with one
    OR-reduction of ``2 * bits`` flags: a bit set on one rank and clear on another
    means the values differ.

    >>> same_on_every_rank(7, lambda flags: flags)   # one rank
    True
    >>> same_on_every_rank(6, lambda flags: [a or b for a, b in zip(flags, [True] * 128)])
    False
    """
    if not 0 <= value < 1 << bits:
        raise ValueError(f"value {value} is outside 0 .. 2**{bits} - 1")
    mine = [bool(value >> i & 1) for i in range(bits)]
    reduced = all_reduce_flags(mine + [not bit for bit in mine])
    return not any(reduced[i] and reduced[bits + i] for i in range(bits))


def restore_callback_states(
    callbacks: Sequence[Callback], meta: dict[str, Any], path: Path, *, announce: bool = True
) -> None:
    """Give each stateful callback its state from the checkpoint; with ``announce``, a
    stateful callback the checkpoint's run did not have, or one it had and this run
    drops, is said in one log line each."""
    states: dict[str, Any] = meta.get("callbacks", {})
    keys = {cb.state_key for cb in callbacks if cb.state_key is not None}
    for cb in callbacks:
        if cb.state_key is None:
            continue
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
        elif announce:
            log.warning(
                "resuming with callback %r, which the run of checkpoint %s did not have: it "
                "starts from its initial state",
                cb.state_key,
                path,
            )
    dropped = sorted(set(states) - keys)
    if dropped and announce:
        log.warning(
            "resuming without callback%s %s, which the run of checkpoint %s had: %s state "
            "there is not used",
            "s" if len(dropped) > 1 else "",
            ", ".join(repr(key) for key in dropped),
            path,
            "their" if len(dropped) > 1 else "its",
        )


def planned_settings(run_dir: Path, resume: str) -> dict[str, Any]:
    """The settings recorded by the checkpoint a resume would start from (``auto``: the
    first of ``resume_order`` whose ``baton.json`` reads), unverified; ``{}`` when there
    is none (the ``Resumer`` then says why)."""
    if resume == "none":
        return {}
    checkpoint_dir = ckpt.checkpoints_dir(run_dir)
    if resume == "auto":
        candidates = ckpt.resume_order(checkpoint_dir)
    else:
        named = Path(resume)
        candidates = [named if named.exists() else checkpoint_dir / named]
    for candidate in candidates:
        try:
            meta: Any = json.loads((candidate / ckpt.META_FILE).read_text())
            settings: Any = meta["settings"]
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if isinstance(settings, dict):
            return {str(k): v for k, v in cast(dict[Any, Any], settings).items()}
    return {}


def error_summary(error: BaseException, limit: int = 600) -> str:
    """``Type: message`` of a load error, its innermost line when the message is a
    multi-line report (a traceback text gathered from several ranks)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", line)]
    text = named[-1] if named else f"{type(error).__name__}: {lines[-1] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
