"""baton.backends.megatron: Megatron-Core (GPTModel, DDP, optimizer, schedules) in baton's loop.

Importing this package is cheap (no torch, no megatron): it registers the backend
lazily and the CPU patches; torch and megatron load with ``MegatronBackend``.

Example::

    from baton.backends.megatron import MegatronBackend, MegatronConfig
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.backends.megatron import patches as _patches  # noqa: F401  (registers the patches)
from baton.core.registry import BACKENDS

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend
    from baton.backends.megatron.config import DataConfig, MegatronConfig

__all__ = ["DataConfig", "MegatronBackend", "MegatronConfig"]

BACKENDS.add_lazy("megatron", "baton.backends.megatron.backend:MegatronBackend")


def __getattr__(name: str) -> Any:
    if name == "MegatronBackend":
        from baton.backends.megatron.backend import MegatronBackend

        return MegatronBackend
    if name in ("MegatronConfig", "DataConfig", "tiny_transformer_config"):
        from baton.backends.megatron import config

        return getattr(config, name)
    raise AttributeError(name)
