"""baton.backends.torchtitan: TorchTitan's Trainer driven step by step by baton's loop.

Importing this package is cheap (no torch, no torchtitan): it registers the backend
lazily and the TorchTitan patches (``baton patches --backend torchtitan``).

Example::

    from baton.backends.torchtitan import TorchTitanBackend
    from baton.backends.torchtitan.configs import llama3_debug
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.torchtitan import patches as patches
from baton.core.registry import BACKENDS

if TYPE_CHECKING:
    from baton.backends.torchtitan.backend import TorchTitanBackend

__all__ = ["TorchTitanBackend"]

BACKENDS.add_lazy(
    "torchtitan",
    "baton.backends.torchtitan.backend:TorchTitanBackend",
    "TorchTitan's Trainer, one Trainer.train_step per baton step.",
)


__getattr__ = lazy_exports(__name__, {"TorchTitanBackend": "backend"})
