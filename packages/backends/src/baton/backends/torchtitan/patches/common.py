"""What every TorchTitan patch shares: the TorchTitan releases they fix and the
condition of those that apply only without an accelerator.

Example::

    from baton.backends.torchtitan.patches.common import VERSIONS, no_accelerator

    class MyFix(Patch):
        versions = VERSIONS
        def condition(self, backend):
            return no_accelerator()   # (True, "no accelerator found") on CPU
"""

from __future__ import annotations

VERSIONS = ">=0.3,<0.4"


def no_accelerator() -> tuple[bool, str]:
    """``(True, reason)`` when torch finds no accelerator (a CPU-only run)."""
    from torch._utils import _get_available_device_type

    found = _get_available_device_type()
    if found is None:
        return True, "no accelerator found"
    return False, f"accelerator {found!r} present"
