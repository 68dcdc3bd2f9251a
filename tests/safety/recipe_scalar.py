"""A recipe over the pure-Python scalar backend, for command-line tests that must be fast:
``baton run tests/safety/recipe_scalar.py --run-dir /tmp/r --max-steps 6``."""

from __future__ import annotations

from baton.callbacks import Checkpoint, CompositeLogger
from baton.core import Driver
from support.scalar_backend import ScalarBackend


def recipe(
    run_dir: str,
    max_steps: int = 6,
    lr: float = 0.1,
    batch_size: int = 2,
    save_every: int = 3,
    log_every: int = 1,
    sinks: str = "jsonl",
) -> Driver:
    """Gradient descent on a scalar, saved every few steps."""
    return Driver(
        ScalarBackend(lr=lr),
        [
            Checkpoint(every_n_steps=save_every, keep_last=None),
            CompositeLogger(sinks.split(",")),
        ],
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
    )
