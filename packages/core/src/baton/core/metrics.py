"""What a backend's step returns, and the single host transfer on log steps.

A ``StepOutput`` holds backend arrays (torch tensors, jax arrays) untouched; nothing
in the driver reads them on a step that does not log. On a log step the driver hands
every pending value to ``backend.fetch`` at once, which moves them to the host in one
transfer and returns floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepOutput:
    """One optimizer step's results, lazily held.

    ``loss`` and ``metrics`` values may be device arrays; ``tokens`` and ``samples``
    are host integers (the backend knows its batch shape without a sync).
    ``data_wait_s`` is the wall time the step spent waiting for its batches, where the
    backend fetches them itself and times the fetch (one ``perf_counter`` pair around
    it); ``0.0`` where it does not (the ``Goodput`` callback's ``data_waiting``).
    """

    loss: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    samples: int = 0
    data_wait_s: float = 0.0

    def lazy_values(self) -> dict[str, Any]:
        values = dict(self.metrics)
        if self.loss is not None:
            values["loss"] = self.loss
        return values


class NamedMetrics(dict[str, Any]):
    """Evaluation metrics a backend returns under the names their author chose (a
    LightningModule's ``self.log("val_loss", ...)``): the driver hands them to
    callbacks and sinks unchanged. The keys of any other mapping ``evaluate`` returns
    are the backend's own (``loss``) and become ``eval/<key>`` (``eval/loss``).
    A backend that returns them sets ``names_evaluation_metrics = True``: a callback
    monitoring ``val_loss`` then waits for the first evaluation before calling the
    key unknown.

    Example::

        def evaluate(self):
            return NamedMetrics(val_loss=loss, val_acc=acc)   # on_eval_end: val_loss, val_acc
    """


def evaluation_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` under the names callbacks see: as they are for ``NamedMetrics``,
    otherwise each key prefixed with ``eval/`` (where it is not already).

    >>> evaluation_keys({"loss": 2.0})
    {'eval/loss': 2.0}
    >>> evaluation_keys(NamedMetrics(val_loss=2.0))
    {'val_loss': 2.0}
    """
    if isinstance(values, NamedMetrics):
        return dict(values)
    return {k if k.startswith("eval/") else f"eval/{k}": v for k, v in values.items()}


def to_float(value: Any) -> float:
    """Convert one host value (python number, numpy scalar, 0-d array) to ``float``."""
    if hasattr(value, "item"):
        return float(value.item())
    return float(value)


#: The keys every backend and the driver log with one meaning: key -> (meaning, who logs
#: it). The documentation's metrics table is generated from this (``baton.tools.reference``).
STANDARD_METRICS: dict[str, tuple[str, str]] = {
    "loss": (
        "the step's training loss: mean over its micro-batches (token-mean cross-entropy "
        "for the LLM backends)",
        "every backend",
    ),
    "lr": (
        "the learning rate the step's update used (first parameter group; TorchTitan with "
        "several optimizers: `lr/<optimizer>[/<group>]`)",
        "every backend",
    ),
    "grad_norm": (
        "the global L2 norm of the gradients **before** clipping (where the backend clips "
        "or computes it)",
        "every backend",
    ),
    "grad_norm_clipped": ("the norm after clipping, where the backend reports it", "MaxText"),
    "skipped_update": (
        "1.0 when the optimizer skipped the step (a non-finite gradient)",
        "Megatron-Core",
    ),
    "moe/aux_loss": (
        "a mixture-of-experts model's load-balancing loss as the backend adds it to the "
        "loss (coefficient included), on log steps: each framework's own formula "
        "(docs/one-model.md names how each differs from `transformers`')",
        "every backend training a Qwen3-MoE but TorchTitan (whose Qwen3-MoE adds none)",
    ),
    "moe/z_loss": (
        "the router z-loss as the backend adds it to the loss, where the model has one",
        "backends whose MoE router adds a z-loss",
    ),
    "moe/load_balance": (
        "the expert load balance of the step: tokens routed to the busiest expert over the "
        "mean tokens per expert (1.0 is perfect balance), the largest over MoE layers",
        "every backend training a Qwen3-MoE",
    ),
    "moe/dropped_fraction": (
        "the fraction of routed token slots dropped by a capacity factor (0.0 when the "
        "router is dropless)",
        "backends whose router has a capacity factor",
    ),
    "tokens": ("tokens trained on so far, all ranks together", "the driver"),
    "samples": ("samples trained on so far, all ranks together", "the driver"),
    "train_time_s": ("training wall time so far, over every resume", "the driver"),
    "timing/generation_s": (
        "a run that trains on rollouts: the host seconds making the step's new rollouts "
        "(sampling, rewards, the reference, sending them to every rank; 0.0 on a step that "
        "reuses the last ones)",
        "the rollout phase",
    ),
    "timing/weight_sync_s": (
        "a run that trains on rollouts: the host seconds gathering the policy's weights and "
        "loading them into the generator (0.0 when they did not change)",
        "the rollout phase",
    ),
    "timing/train_s": (
        "a run that trains on rollouts: the host seconds of the backend's `train_step`",
        "the driver",
    ),
    "eval/<name>": (
        "evaluation results (`eval/loss`), only in `on_eval_end`; a LightningModule's "
        "validation values keep the names it logged (`val_loss`)",
        "every backend that evaluates",
    ),
}
