"""A monitored metric key, read in the phase its name belongs to, failing loudly when absent.

Example::

    watched = Monitored("eval/loss", owner="EarlyStopping")
    watched.phase                            # "eval": read in on_eval_end
    watched.read("eval", 100, {"eval/loss": 2.1})    # 2.1
    watched.read("train", 100, {"loss": 2.3})        # None: not this phase
    watched.read("eval", 100, {"eval/ppl": 8.2})     # ValueError naming eval/ppl

Keys starting with ``eval/`` are evaluation metrics (``on_eval_end``); every other key
is a training metric (``on_log``). A key missing from the first metrics of its phase is
a mistyped ``monitor=``: the run stops with an error listing the keys that exist
instead of silently never acting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton.callbacks.sinks import Phase


class Monitored:
    """One metric key a callback watches (keep-best checkpoints, early stopping)."""

    def __init__(self, key: str, owner: str) -> None:
        self.key = key
        self.owner = owner
        self.phase: Phase = "eval" if key.startswith("eval/") else "train"

    def read(self, phase: Phase, step: int, metrics: dict[str, float]) -> float | None:
        """The value in ``metrics`` of ``phase``; ``None`` for the other phase."""
        if phase != self.phase:
            return None
        if self.key not in metrics:
            what = "evaluation" if phase == "eval" else "training"
            raise ValueError(
                f"{self.owner}: monitor={self.key!r} is not among the {what} metrics of "
                f"step {step}; they are: {', '.join(sorted(metrics)) or '(none)'}. "
                "Use one of these keys (evaluation keys start with 'eval/'), or add the "
                f"callback that logs {self.key!r} before {self.owner}"
            )
        return float(metrics[self.key])
