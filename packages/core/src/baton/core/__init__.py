"""baton.core: the backend-agnostic loop driver (no torch, no jax imports).

Example::

    from baton.core import Callback, DriverView

    class StopAtLoss(Callback):
        '''Stop once the logged loss drops below a threshold.'''

        def __init__(self, threshold: float) -> None:
            self.threshold = threshold

        def on_log(self, driver: DriverView, metrics: dict[str, float]) -> None:
            if metrics["loss"] < self.threshold:
                driver.control.request_stop(f"loss {metrics['loss']:.3f} < {self.threshold}")
"""

from baton.core.abilities import Abilities, Ability, MissingAbilityError
from baton.core.backend import Backend, BackendBase, DataExhausted, PendingSave, RunLimits
from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend
from baton.core.callback import (
    CHECKPOINT_PRIORITY,
    DISPLAY_PRIORITY,
    GUARD_PRIORITY,
    LOGGER_PRIORITY,
    METRIC_PRIORITY,
    PATCH_PRIORITY,
    STOP_REQUEST_PRIORITY,
    Callback,
)
from baton.core.checkpoint_record import LOAD_ALL, CheckpointFacts, LoadPlan
from baton.core.checkpoints.files import CheckpointError
from baton.core.checkpoints.io import CheckpointIO, UsesCheckpointIO
from baton.core.control import Control
from baton.core.driver import Driver, RunResult
from baton.core.driver_view import DriverView
from baton.core.errors import BatonError, RunError, UsageError
from baton.core.hooks import EXIT_HOOKS, HOOKS
from baton.core.metrics import NamedMetrics, StepOutput
from baton.core.options import RunOptions
from baton.core.patches import PATCHES, Patch, PatchRecorder, register_patch
from baton.core.registry import BACKENDS, CALLBACKS, Registry, UnknownNameError

__all__ = [
    "BACKENDS",
    "CALLBACKS",
    "CHECKPOINT_PRIORITY",
    "DISPLAY_PRIORITY",
    "EXIT_HOOKS",
    "GUARD_PRIORITY",
    "HOOKS",
    "LOAD_ALL",
    "LOGGER_PRIORITY",
    "METRIC_PRIORITY",
    "PATCHES",
    "PATCH_PRIORITY",
    "STOP_REQUEST_PRIORITY",
    "Abilities",
    "Ability",
    "Backend",
    "BackendBase",
    "BackendDescriptor",
    "BatonError",
    "Callback",
    "CheckpointError",
    "CheckpointFacts",
    "CheckpointIO",
    "CompareRun",
    "Control",
    "DataExhausted",
    "Driver",
    "DriverView",
    "LoadPlan",
    "MissingAbilityError",
    "NamedMetrics",
    "Patch",
    "PatchRecorder",
    "PendingSave",
    "Registry",
    "RunError",
    "RunLimits",
    "RunOptions",
    "RunResult",
    "StepOutput",
    "UnknownNameError",
    "UsageError",
    "UsesCheckpointIO",
    "declare_backend",
    "register_patch",
]
