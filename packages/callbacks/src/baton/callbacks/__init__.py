"""baton.callbacks: the standard callbacks (one module each), registered by name.

Nothing here imports torch or jax at module level: the callbacks run unchanged on
every backend, talking to it only through the driver.

Example::

    from baton.callbacks import Checkpoint, CompositeLogger, Preemption, ThroughputMonitor

    callbacks = [Checkpoint(every_n_steps=500, keep_last=2), Preemption(),
                 ThroughputMonitor(), CompositeLogger(["jsonl", "tensorboard"])]
"""

from baton.callbacks.checkpoint import Checkpoint
from baton.callbacks.composite_logger import CompositeLogger
from baton.callbacks.early_stopping import EarlyStopping
from baton.callbacks.gc_control import GarbageCollection
from baton.callbacks.loss_guard import LossGuard
from baton.callbacks.memory import MemoryMonitor
from baton.callbacks.optimizer_monitor import OptimizerMonitor
from baton.callbacks.preemption import Preemption
from baton.callbacks.profiler import Profiler
from baton.callbacks.progress import Progress
from baton.callbacks.throughput import ThroughputMonitor
from baton.callbacks.time_limit import TimeLimit

__all__ = [
    "Checkpoint",
    "CompositeLogger",
    "EarlyStopping",
    "GarbageCollection",
    "LossGuard",
    "MemoryMonitor",
    "OptimizerMonitor",
    "Preemption",
    "Profiler",
    "Progress",
    "ThroughputMonitor",
    "TimeLimit",
]
