"""Undo TorchTitan's process-wide changes when a run ends (gc, process group,
environment, autograd and determinism switches)::

    BATON_PATCHES=all,-torchtitan_restore_process_state baton run recipes/torchtitan_llama3_debug.py
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from baton.backends.torchtitan.patches.common import VERSIONS
from baton.core.patches import Patch, PatchRecorder

if TYPE_CHECKING:
    from baton.core.driver_view import DriverView

#: environment variables TorchTitan sets process-wide while it builds and seeds
TORCHTITAN_ENV = (
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_FR_DUMP_TEMP_FILE",
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
)


class TorchTitanRestoreProcessState(Patch):
    """Undo TorchTitan's process-wide changes on teardown: gc, process group, env, autograd.

    ``Trainer.__init__`` disables the garbage collector (baton runs TorchTitan's
    periodic collection each step instead) and never re-enables it; when it creates
    the process group it sets NCCL/flight-recorder environment variables and turns
    off autograd multithreading; seeding sets ``PYTHONHASHSEED``; deterministic mode
    flips torch's deterministic-algorithms switch. This records the state before the
    run and restores it afterwards, destroying the process group if it was created
    during the run.
    """

    name = "torchtitan_restore_process_state"
    backend = "torchtitan"
    versions = VERSIONS
    phase = "configure"

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
        import gc

        import torch
        import torch.distributed as dist

        had_group = dist.is_available() and dist.is_initialized()
        gc_enabled = gc.isenabled()
        multithreading = torch._C._is_multithreading_enabled()
        deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        for key in TORCHTITAN_ENV:  # unchanged now; the undo puts back what TorchTitan sets
            recorder.setenv(key, os.environ.get(key))

        def restore() -> None:
            torch.autograd.set_multithreading_enabled(multithreading)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
            if not had_group and dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
            if gc_enabled:
                gc.enable()
            else:
                gc.disable()

        recorder.on_undo("restore gc, process group and autograd settings", restore)
