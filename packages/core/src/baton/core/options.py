"""How one run is driven: its limits, cadences, run directory, resume and save policy,
as one dataclass checked once, when it is made.

``Driver(backend, max_steps=100, log_every=10)`` builds a ``RunOptions`` from its
keywords; a recipe or a command line may build one and pass it whole::

    options = RunOptions(max_steps=100, run_dir="runs/tiny", resume="auto")
    driver = Driver(backend, callbacks, options=options)
    options.limits_reached(step=100, tokens=0)      # ['max_steps=100 reached']

A bad value is a ``UsageError`` naming the option and what it accepts. The driver reads
its options one way, ``driver.options.log_every``; changing one later replaces the
dataclass (``driver.options = driver.options.replace(log_every=5)``), so the new value
is checked like the first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from baton.core.errors import UsageError

#: ``resume`` values that start a fresh run
NO_RESUME = ("", "none")


#: settings whose change alters training (a recipe parameter or driver limit of that name)
TRAINING_SETTINGS: frozenset[str] = frozenset(
    {
        "lr",
        "learning_rate",
        "lr_schedule",
        "min_lr",
        "min_lr_ratio",
        "warmup_steps",
        "decay_steps",
        "max_steps",
        "max_tokens",
        "batch_size",
        "global_batch_size",
        "micro_batch_size",
        "seq_len",
        "seq_length",
        "sequence_length",
        "data",
        "data_path",
        "eval_split",
        "dataset",
        "dataset_path",
        "tokenizer",
        "tokenizer_path",
    }
)

#: how much of each checkpoint ``read_meta`` checks: every byte, or only the sizes
VERIFY_MODES = ("full", "size")


def check_verify(verify: str) -> str:
    if verify not in VERIFY_MODES:
        raise UsageError(
            f"verify={verify!r} is not one of {', '.join(VERIFY_MODES)} "
            "('full' checks every byte against its checksum, 'size' only file sizes)"
        )
    return verify


def parse_allowed(text: str | Iterable[str] | None) -> set[str]:
    """``"lr,max_steps"`` (or a list) -> ``{"lr", "max_steps"}``; ``"all"`` allows every one."""
    if text is None:
        return set()
    items = text.split(",") if isinstance(text, str) else list(text)
    return {item.strip().replace("-", "_") for item in items if item.strip()}


class OptionKeywords(TypedDict, total=False):
    """The options as keywords (``Driver(backend, max_steps=100, run_dir="runs/x")``),
    in the looser forms people write them."""

    max_steps: int | None
    max_tokens: int | None
    max_time_s: float | None
    log_every: int
    eval_every: int | None
    run_dir: str | Path
    resume: str | Path
    patches: str | None
    settings: dict[str, Any] | None
    save_on_stop: bool
    async_save: bool
    verify: str
    overwrite: bool
    allow_changed: str | Iterable[str]
    training_settings: Iterable[str]
    checkpoint_upload: str | None


@dataclass(frozen=True)
class RunOptions:
    """The options of one run.

    Attributes:
        max_steps / max_tokens / max_time_s: stop conditions (at least one is set; the
            run stops when any is reached).
        log_every: the log cadence; metrics reach the host only on log steps.
        eval_every: evaluate every N steps (``None`` or 0: only when a callback asks);
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
        training_settings: setting names whose change on resume is refused (always
            including ``TRAINING_SETTINGS``).
        checkpoint_upload: a URL (``s3://bucket/prefix``) where every complete
            checkpoint is also uploaded, in the background, and from which
            ``resume="auto"`` fetches the newest one when the run directory has none
            (the ``checkpoint_upload`` callback, ``baton-callbacks[s3]``).
    """

    max_steps: int | None = None
    max_tokens: int | None = None
    max_time_s: float | None = None
    log_every: int = 10
    eval_every: int | None = None
    run_dir: Path = Path("runs/baton")
    resume: str = "none"
    patches: str | None = None
    settings: dict[str, Any] = field(default_factory=dict[str, Any])
    save_on_stop: bool = False
    async_save: bool = False
    verify: str = "full"
    overwrite: bool = False
    allow_changed: frozenset[str] = frozenset()
    training_settings: frozenset[str] = TRAINING_SETTINGS
    checkpoint_upload: str | None = None

    @classmethod
    def from_keywords(cls, **given: Unpack[OptionKeywords]) -> RunOptions:
        """``RunOptions`` from keywords in their looser forms (a copy of ``settings``)."""
        loose: dict[str, Any] = dict(given)
        loose["settings"] = dict(given.get("settings") or {})
        return cls(**loose)

    def __post_init__(self) -> None:
        # accept the looser forms callers pass (``"runs/x"``, ``"lr,max_steps"``, a
        # ``Path`` to resume from) and keep one form each
        resume: Any = self.resume
        settings: Any = self.settings
        object.__setattr__(self, "settings", {} if settings is None else settings)
        eval_every: Any = self.eval_every
        if type(eval_every) is int and eval_every == 0:
            object.__setattr__(self, "eval_every", None)  # 0 turns evaluation off
        allowed: str | Iterable[str] | None = self.allow_changed
        extra: Iterable[str] = self.training_settings
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        object.__setattr__(self, "resume", "none" if resume in (None, "") else str(resume))
        object.__setattr__(self, "allow_changed", frozenset(parse_allowed(allowed)))
        object.__setattr__(self, "training_settings", TRAINING_SETTINGS | frozenset(extra))
        self._check()

    def _check(self) -> None:
        """Reject impossible loop settings before anything is created."""
        if self.max_steps is None and self.max_tokens is None and self.max_time_s is None:
            raise UsageError("set at least one of max_steps, max_tokens, max_time_s")
        for name, value, least in (
            ("max_steps", self.max_steps, 0),
            ("max_tokens", self.max_tokens, 0),
            ("log_every", self.log_every, 1),
            ("eval_every", self.eval_every, 1),
        ):
            whole = isinstance(value, int) and not isinstance(value, bool)
            if value is not None and not whole:
                raise UsageError(f"{name} must be a whole number, got {value!r}")
            if value is not None and value < least:
                raise UsageError(f"{name} must be >= {least}, got {value}")
        if self.max_time_s is not None and not self.max_time_s > 0:
            raise UsageError(f"max_time_s must be > 0 seconds, got {self.max_time_s}")
        check_verify(self.verify)

    @property
    def resumes(self) -> bool:
        """Whether the run continues a checkpoint (``resume`` is not ``"none"``)."""
        return self.resume not in NO_RESUME

    def replace(self, **changes: Any) -> RunOptions:
        """A copy with ``changes``, checked like a new one."""
        return dataclasses.replace(self, **changes)

    def limits(self) -> dict[str, Any]:
        """The stop limits, as each checkpoint records them (``"driver"``)."""
        return {
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "max_time_s": self.max_time_s,
        }

    def limits_reached(self, step: int, tokens: int) -> list[str]:
        """Why the step and token limits stop the run at these counts (empty: they do
        not). Every rank counts alike, so every rank reaches them at the same step."""
        reasons: list[str] = []
        if self.max_steps is not None and step >= self.max_steps:
            reasons.append(f"max_steps={self.max_steps} reached")
        if self.max_tokens is not None and tokens >= self.max_tokens:
            reasons.append(f"max_tokens={self.max_tokens} reached")
        return reasons

    def time_limit_reached(self, train_time_s: float) -> str | None:
        """Why the time limit stops the run, or ``None`` (wall clocks differ by rank)."""
        if self.max_time_s is not None and train_time_s >= self.max_time_s:
            return f"max_time_s={self.max_time_s:g} reached"
        return None
