"""The TorchTitan backend's evaluation: TorchTitan's own validator
(``config.validator``), its loss caught on the way to TorchTitan's metrics logging.

Example (what ``TorchTitanBackend.evaluate`` does)::

    validate(trainer, config)   # {"loss": 2.31}; UsageError if the validator is off
"""

from __future__ import annotations

from typing import Any

from baton.core.errors import UsageError

#: why a run whose validator is off cannot evaluate, and the fix
NO_VALIDATION = (
    "nothing to evaluate on: pass --eval-split F (the last documents of the run's data, as "
    "the run had) or --eval-data-path FILE_OR_PREFIX (configs.set_evaluation turns "
    "TorchTitan's validator on)"
)


def validate(trainer: Any, config: Any) -> dict[str, float]:
    """Run ``trainer.validator`` once and return its loss (TorchTitan still logs it)."""
    if not config.validator.enable:
        raise UsageError(NO_VALIDATION)
    processor = trainer.metrics_processor
    seen: dict[str, float] = {}
    original = processor.log_validation

    def log_validation(loss: float, step: int, extra_metrics: Any = None) -> None:
        seen["loss"] = loss
        original(loss=loss, step=step, extra_metrics=extra_metrics)

    processor.log_validation = log_validation
    try:
        trainer.validator.validate(trainer.model_parts, trainer.step)
    finally:
        del processor.log_validation
    return seen
