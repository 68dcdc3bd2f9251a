"""The LightningModule backend's patches: Fabric's, registered under its name.

A LightningModule runs through Lightning Fabric, so the messages Fabric prints are the
same as under the ``fabric`` backend (``baton.backends.fabric.patches``).
"""

from __future__ import annotations

from baton.backends.fabric.patches import FabricQuiet
from baton.core.patches import register_patch


@register_patch
class LightningQuiet(FabricQuiet):
    """Hide Lightning's process-group banner on multi-process runs (each with its reason)."""

    name = "lightning_quiet"
    backend = "lightning"
