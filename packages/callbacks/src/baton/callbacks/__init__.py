"""baton.callbacks: the standard callbacks (one module each), registered by name.

Nothing here imports torch or jax at module level: the callbacks run unchanged on
every backend, talking to it only through the driver.

Example::

    from baton.callbacks import LossGuard, standard_callbacks

    # Checkpoint, Preemption, ThroughputMonitor, CompositeLogger (+ console), Progress
    callbacks = standard_callbacks(save_every=500, keep_last=2, extra=[LossGuard()])
"""

from baton.callbacks.checkpoint import Checkpoint
from baton.callbacks.checkpoint_upload import CheckpointUpload
from baton.callbacks.composite_logger import CompositeLogger
from baton.callbacks.corruption_check import CorruptionCheck
from baton.callbacks.early_stopping import EarlyStopping
from baton.callbacks.ema import EMA
from baton.callbacks.freeze import Freeze
from baton.callbacks.gc_control import GarbageCollection
from baton.callbacks.goodput import Goodput
from baton.callbacks.gradient_norms import GradientNormMonitor
from baton.callbacks.loss_guard import LossGuard
from baton.callbacks.memory import MemoryMonitor
from baton.callbacks.optimizer_monitor import OptimizerMonitor
from baton.callbacks.preemption import Preemption
from baton.callbacks.profiler import Profiler
from baton.callbacks.progress import Progress
from baton.callbacks.rollout_records import RolloutRecords
from baton.callbacks.standard import CONSOLE_KEYS, standard_callbacks
from baton.callbacks.throughput import ThroughputMonitor
from baton.callbacks.time_limit import TimeLimit
from baton.callbacks.watchdog import Watchdog
from baton.callbacks.weight_monitor import WeightMonitor

__all__ = [
    "CONSOLE_KEYS",
    "EMA",
    "Checkpoint",
    "CheckpointUpload",
    "CompositeLogger",
    "CorruptionCheck",
    "EarlyStopping",
    "Freeze",
    "GarbageCollection",
    "Goodput",
    "GradientNormMonitor",
    "LossGuard",
    "MemoryMonitor",
    "OptimizerMonitor",
    "Preemption",
    "Profiler",
    "Progress",
    "RolloutRecords",
    "ThroughputMonitor",
    "TimeLimit",
    "Watchdog",
    "WeightMonitor",
    "standard_callbacks",
]
