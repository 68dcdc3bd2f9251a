"""A backend package's public names, imported on first use.

Importing ``baton.backends.<name>`` registers the backend and its patches without
importing its framework (torch, jax, megatron, maxtext); its public classes load with the
first access. Each package's ``__init__.py`` says where each name lives::

    __getattr__ = lazy_exports(__name__, {"FabricBackend": "backend", "GPTConfig": "models.gpt"})

``from baton.backends.fabric import FabricBackend`` then imports
``baton.backends.fabric.backend`` at that line, not before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``where`` (public
    name -> submodule, relative to ``package``) from its submodule when first read; any
    other name raises ``AttributeError``."""
    modules = dict(where)

    def __getattr__(name: str) -> Any:
        submodule = modules.get(name)
        if submodule is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{submodule}"), name)

    return __getattr__
