"""baton.backends.fabric: plain PyTorch through Lightning Fabric (the built-in default).

Importing this package is cheap; torch and lightning load with ``FabricBackend``.

Example::

    from baton.backends.fabric import FabricBackend, GPTConfig
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.core.registry import BACKENDS

if TYPE_CHECKING:
    from baton.backends.fabric.backend import FabricBackend, FabricConfig
    from baton.backends.fabric.model import GPTConfig

__all__ = ["FabricBackend", "FabricConfig", "GPTConfig"]

BACKENDS.add_lazy(
    "fabric",
    "baton.backends.fabric.backend:FabricBackend",
    "Plain PyTorch models through lightning.fabric.Fabric (device, precision, DDP/FSDP).",
)


def __getattr__(name: str) -> Any:
    if name in ("FabricBackend", "FabricConfig"):
        from baton.backends.fabric import backend

        return getattr(backend, name)
    if name == "GPTConfig":
        from baton.backends.fabric.model import GPTConfig

        return GPTConfig
    raise AttributeError(name)
