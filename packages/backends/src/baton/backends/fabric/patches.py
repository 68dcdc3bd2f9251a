"""Lightning Fabric's patches: its notes that concern baton's code, not the run, hidden
from the console; and no NVML retry at every optimizer step on a host without one.

A run of several processes (``FabricConfig(devices=2)``, or under torchrun) has every
rank announce itself as it joins the process group, and rank 0 print a framed block
saying the group is complete. baton already says where a run goes (``run.json``, the
``done:`` line with the world size in ``baton.json``); a failed join still raises.
This module imports neither torch nor lightning.

    baton patches --backend fabric           # lists it
    BATON_PATCHES=all,-fabric_quiet baton run recipes/quickstart.py   # shows the banner
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from baton.core.patches import Patch, PatchRecorder, register_patch
from baton.core.quiet import Quiet, QuietPatch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

#: the frame Lightning draws around its "processes registered" block
_RULE = "-" * 100
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)


@register_patch
class FabricQuiet(QuietPatch):
    """Hide Lightning's process-group banner on multi-process runs (each with its reason)."""

    name = "fabric_quiet"
    backend = "fabric"
    distribution = "lightning"
    versions = ">=2.6,<2.7"
    quiet = (
        Quiet(
            "Initializing distributed: GLOBAL_RANK:",
            logger="lightning.fabric.utilities.distributed",
            reason="one line per rank as it joins the process group, before training; a rank "
            "that cannot join raises with its own message",
        ),
        *(
            Quiet(
                f"{_RULE}\ndistributed_backend=",
                logger=logger,
                reason="rank 0's framed block saying every process joined; the world size is "
                "in run.json and each checkpoint's baton.json",
            )
            # Lightning's rank-zero messages go to the logger of whichever of its packages
            # loaded last: lightning.pytorch's once ``import lightning`` ran
            for logger in _RANK_ZERO_LOGGERS
        ),
    )


#: the variable Lightning sets at import so that ``torch.cuda.is_available()`` asks NVML
#: (no CUDA initialisation before a fork) instead of the CUDA runtime
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


@register_patch
class FabricNoNvmlRetry(Patch):
    """On a host without an NVIDIA driver, stop torch retrying to load NVML at each step."""

    # Importing Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1. torch then answers
    # ``torch.cuda.is_available()`` by loading libnvidia-ml, and where that library does
    # not exist it tries again at every call: about 30 us each, several times in each
    # optimizer step (AdamW's capture-health and foreach checks), 100-120 us a step
    # measured on the CPU benchmark (3 % of its step). Where NVML cannot load there is no
    # NVIDIA driver, so torch's default check (cudaGetDeviceCount, cached, no context, no
    # fork hazard without a driver) gives the same answer: the variable is removed for the
    # run and restored at teardown. Not on ROCm builds (their default check starts HIP).

    name = "fabric_no_nvml_retry"
    backend = "fabric"
    versions = ">=2.6,<2.7"
    phase = "setup"

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch

        if torch.version.hip is not None:
            return False, "a ROCm build (its default check initialises HIP)"
        if nvml_loads():
            return False, "NVML loads on this host (torch's check is cheap)"
        return True, "no NVML on this host"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        import lightning.fabric  # noqa: F401  (its import is what sets the variable)

        if os.environ.get(NVML_CHECK) == "1":
            recorder.setenv(NVML_CHECK, None)


def nvml_loads() -> bool:
    """Whether the NVIDIA management library loads on this host (an NVIDIA driver)."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
