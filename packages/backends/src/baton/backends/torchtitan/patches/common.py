"""What every TorchTitan patch shares: the TorchTitan releases they fix, and the base
of those that apply only without an accelerator.

Example::

    from baton.backends.torchtitan.patches.common import CpuOnlyPatch

    class MyCpuFix(CpuOnlyPatch):   # backend "torchtitan", VERSIONS, no accelerator
        name = "torchtitan_my_cpu_fix"
        phase = "configure"
        def apply(self, driver, recorder): ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.core.patches import Patch

if TYPE_CHECKING:
    from baton.core.backend import Backend

VERSIONS = ">=0.3,<0.4"


def no_accelerator() -> tuple[bool, str]:
    """``(True, reason)`` when torch finds no accelerator (a CPU-only run)."""
    from torch._utils import _get_available_device_type

    found = _get_available_device_type()
    if found is None:
        return True, "no accelerator found"
    return False, f"accelerator {found!r} present"


class CpuOnlyPatch(Patch):
    """A TorchTitan fix that applies only when torch finds no accelerator."""

    backend = "torchtitan"
    versions = VERSIONS

    def condition(self, backend: Backend) -> tuple[bool, str]:
        return no_accelerator()
