"""baton.backends.megatron: Megatron-Core (GPTModel, DDP, optimizer, schedules) in baton's loop.

Importing this package is cheap (no torch, no megatron): it registers the backend
lazily and the CPU patches; torch and megatron load with ``MegatronBackend``.

Example::

    from baton.backends.megatron import MegatronBackend, MegatronConfig
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.megatron import patches as _patches  # noqa: F401  (registers the patches)
from baton.core.registry import BACKENDS

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend
    from baton.backends.megatron.config import DataConfig, MegatronConfig

__all__ = ["DataConfig", "MegatronBackend", "MegatronConfig"]

BACKENDS.add_lazy(
    "megatron",
    "baton.backends.megatron.backend:MegatronBackend",
    "Megatron-Core GPTModel, DDP, optimizer and schedules behind baton's loop.",
)


__getattr__ = lazy_exports(
    __name__,
    {
        "MegatronBackend": "backend",
        "MegatronConfig": "config",
        "DataConfig": "config",
        "tiny_transformer_config": "config",
    },
)
