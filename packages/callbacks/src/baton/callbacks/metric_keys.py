"""A monitored metric key, read in the phase its name belongs to, failing loudly when absent.

Example::

    watched = Monitored("eval/loss", owner="EarlyStopping")
    watched.phase                            # "eval": read in on_eval_end
    watched.read("eval", 100, {"eval/loss": 2.1})    # 2.1
    watched.read("train", 100, {"loss": 2.3})        # None: not this phase
    watched.read("eval", 100, {"eval/ppl": 8.2})     # ValueError naming eval/ppl

Keys starting with ``eval/`` are evaluation metrics (``on_eval_end``). Any other key is
read in the first phase whose metrics carry it: a training metric (``on_log``), or an
evaluation metric a backend returns under its author's name (a LightningModule's
``val_loss``, see ``baton.core.NamedMetrics``)::

    watched = Monitored("val_loss", owner="EarlyStopping")
    watched.read("train", 10, {"loss": 2.3})         # None: not a training metric
    watched.read("eval", 20, {"val_loss": 2.2})      # 2.2; from now on an eval metric

A key missing from the first metrics of its phase (where evaluation keeps names, a key
without ``eval/`` missing from the first training metrics and the first evaluation) is
a mistyped ``monitor=``: the run stops with an error listing the keys that exist
instead of silently never acting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase
    from baton.core import DriverView


def evaluation_may_name(driver: DriverView) -> bool:
    """Whether ``driver``'s run evaluates on a cadence with a backend whose evaluation
    keeps its author's names (``names_evaluation_metrics``: a LightningModule's)."""
    return (
        bool(driver.options.eval_every)
        and "evaluate" in driver.abilities
        and driver.backend.names_evaluation_metrics
    )


class Monitored:
    """One metric key a callback watches (keep-best checkpoints, early stopping)."""

    def __init__(self, key: str, owner: str) -> None:
        self.key = key
        self.owner = owner
        #: the phase whose metrics carry the key (``None``: not known yet)
        self.found_in: Phase | None = "eval" if key.startswith("eval/") else None
        #: the keys of the first training metrics that lacked it
        self._missing_in_training: list[str] | None = None

    @property
    def phase(self) -> Phase:
        """``"eval"`` for an ``eval/`` key or one evaluation carried; else ``"train"``."""
        return self.found_in or "train"

    def read(
        self, phase: Phase, step: int, metrics: dict[str, float], *, named_eval: bool = False
    ) -> float | None:
        """The value in ``metrics`` of ``phase``; ``None`` for the other phase.

        ``named_eval``: the run's evaluation may carry the key under its author's name
        (``evaluation_may_name``); else a key without ``eval/`` is a training metric."""
        if self.found_in is None and self.key in metrics:
            self.found_in = phase
        if self.found_in is not None:
            if phase != self.found_in:
                return None
            if self.key not in metrics:
                self._refuse(phase, step, metrics)
            return float(metrics[self.key])
        if phase == "eval" or not named_eval:
            self._refuse(phase, step, metrics)
        if self._missing_in_training is None:
            self._missing_in_training = sorted(metrics)
        return None

    def _refuse(self, phase: Phase, step: int, metrics: dict[str, float]) -> None:
        what = "evaluation" if phase == "eval" else "training"
        others = ""
        if phase == "eval" and self._missing_in_training is not None:
            others = f" (nor among the training metrics: {', '.join(self._missing_in_training)})"
        raise ValueError(
            f"{self.owner}: monitor={self.key!r} is not among the {what} metrics of "
            f"step {step}; they are: {', '.join(sorted(metrics)) or '(none)'}{others}. "
            "Use one of these keys (the backend's evaluation keys start with 'eval/'), or "
            f"add the callback that logs {self.key!r} before {self.owner}"
        )
