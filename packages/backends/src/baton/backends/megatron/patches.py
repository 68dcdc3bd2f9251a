"""Megatron-Core's CPU fixes as baton patches (applied only when no GPU is present).

Each patch wraps one ``install_*`` function of ``baton.backends.megatron.cpu`` and
undoes it on teardown. They act in the ``configure`` phase, before the backend
builds anything. This module imports neither torch nor megatron at import time.

    baton patches --backend megatron          # lists them
    BATON_PATCHES=all,-megatron_cpu_causal_mask baton run recipes/megatron_gpt_tiny.py
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.dcp_safety import dcp_safe_loading
from baton.core.patches import Patch, PatchRecorder, register_patch

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver import Driver

VERSIONS = ">=0.19,<0.20"


class _CpuPatch(Patch):
    """Common rule: megatron-core 0.19, and only on a machine without a CUDA GPU."""

    backend = "megatron"
    versions = VERSIONS
    phase = "configure"
    installer = ""

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch

        if torch.cuda.is_available():
            return False, "a CUDA GPU is present"
        return True, "no CUDA GPU"

    def apply(self, driver: Driver, recorder: PatchRecorder) -> None:
        import baton.backends.megatron.cpu as cpu

        getattr(cpu, self.installer)(recorder)


@register_patch
class CpuStreams(_CpuPatch):
    """torch.cuda synchronize/current_stream/Stream/stream/empty_cache as no-ops on CPU."""

    name = "megatron_cpu_streams"
    installer = "install_streams"
    priority = -1005


@register_patch
class CpuDevice(_CpuPatch):
    """Hard-coded CUDA devices (device='cuda', current_device(), .cuda()) mean the CPU."""

    name = "megatron_cpu_device"
    installer = "install_device_mode"
    priority = -1004


@register_patch
class CpuRngTracker(_CpuPatch):
    """Megatron's RNG tracker over CPU generator states instead of torch.cuda RNG."""

    name = "megatron_cpu_rng_tracker"
    installer = "install_rng_tracker"
    priority = -1003


@register_patch
class CpuMemoryBuffer(_CpuPatch):
    """parallel_state's global memory buffer allocates on CPU instead of the CUDA device."""

    name = "megatron_cpu_memory_buffer"
    installer = "install_memory_buffer"
    priority = -1002


@register_patch
class CpuCausalMask(_CpuPatch):
    """The default causal attention mask built on CPU instead of device='cuda'."""

    name = "megatron_cpu_causal_mask"
    installer = "install_causal_mask"
    priority = -1001


register_patch(dcp_safe_loading("megatron"))
