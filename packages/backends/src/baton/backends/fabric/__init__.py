"""baton.backends.fabric: any PyTorch model through Lightning Fabric (the built-in default).
An existing ``LightningModule`` has its own backend: ``baton.backends.lightning``.

Importing this package is cheap; torch and lightning load with ``FabricBackend``.

Example::

    from baton.backends.fabric import FabricBackend, FabricConfig
    backend = FabricBackend(model=net, optimizer=lambda m: AdamW(m.parameters()), data=loader)

    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining   # the quickstart's GPT
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baton.backends.fabric import patches as _patches  # noqa: F401  (registers the patches)
from baton.core.registry import BACKENDS

if TYPE_CHECKING:
    from baton.backends.fabric.backend import FabricBackend
    from baton.backends.fabric.config import FabricConfig
    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining

__all__ = ["FabricBackend", "FabricConfig", "GPTConfig", "GPTTraining"]

BACKENDS.add_lazy(
    "fabric",
    "baton.backends.fabric.backend:FabricBackend",
    "Your PyTorch model, optimizer and data through lightning.fabric.Fabric (DDP/FSDP, precision).",
)

_WHERE = {
    "FabricBackend": "backend",
    "FabricConfig": "config",
    "GPTConfig": "models.gpt",
    "GPTTraining": "models.gpt",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        module = importlib.import_module(f"baton.backends.fabric.{_WHERE[name]}")
        return getattr(module, name)
    raise AttributeError(name)
