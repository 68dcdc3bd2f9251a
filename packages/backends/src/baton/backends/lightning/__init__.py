"""baton.backends.lightning: an existing ``LightningModule``, unchanged, under baton.

Importing this package is cheap; torch and lightning load with ``LightningBackend``.
The module runs through Lightning Fabric (the ``fabric`` backend's machinery) with
``Trainer.fit``'s loop semantics; its settings are a ``FabricConfig``.

Example::

    from baton.backends.fabric import FabricConfig
    from baton.backends.lightning import LightningBackend

    backend = LightningBackend(MyLightningModule(), datamodule=MyDataModule(),
                               config=FabricConfig(grad_clip=1.0))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.lightning import patches as _patches  # noqa: F401  (registers the patches)
from baton.core.backend_descriptor import BackendDescriptor, declare_backend

if TYPE_CHECKING:
    from baton.backends.lightning.backend import LightningBackend, LightningHookError

__all__ = ["LightningBackend", "LightningHookError"]

declare_backend(
    BackendDescriptor(
        name="lightning",
        engine="baton.backends.lightning.backend:LightningBackend",
        summary="Your LightningModule (and LightningDataModule) as Trainer.fit runs it, through Fabric.",
        launcher="torchrun",
        objectives=("pretrain",),
        order=20,
    )
)


__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "backend"))
