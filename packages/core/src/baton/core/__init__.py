"""baton.core: the backend-agnostic loop driver (no torch, no jax imports).

Example::

    from baton.core import Callback, Driver

    class StopAtLoss(Callback):
        '''Stop once the logged loss drops below a threshold.'''

        def __init__(self, threshold: float) -> None:
            self.threshold = threshold

        def on_log(self, driver, metrics):
            if metrics["loss"] < self.threshold:
                driver.control.request_stop(f"loss {metrics['loss']:.3f} < {self.threshold}")
"""

from baton.core.backend import Backend, BackendBase, DataExhausted, PendingSave
from baton.core.callback import Callback
from baton.core.checkpointing import CheckpointError
from baton.core.control import Control
from baton.core.driver import Driver, RunResult
from baton.core.hooks import EXIT_HOOKS, HOOKS
from baton.core.metrics import StepOutput
from baton.core.patches import PATCHES, Patch, PatchRecorder, register_patch
from baton.core.registry import BACKENDS, CALLBACKS, Registry, UnknownNameError

__all__ = [
    "BACKENDS",
    "CALLBACKS",
    "EXIT_HOOKS",
    "HOOKS",
    "PATCHES",
    "Backend",
    "BackendBase",
    "Callback",
    "CheckpointError",
    "Control",
    "DataExhausted",
    "Driver",
    "Patch",
    "PatchRecorder",
    "PendingSave",
    "Registry",
    "RunResult",
    "StepOutput",
    "UnknownNameError",
    "register_patch",
]
