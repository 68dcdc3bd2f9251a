"""baton.callbacks: the standard callbacks (one module each), registered by name.

Nothing here imports torch or jax at module level: the callbacks run unchanged on
every backend, talking to it only through the driver.
"""

from baton.callbacks.progress import Progress

__all__ = ["Progress"]
