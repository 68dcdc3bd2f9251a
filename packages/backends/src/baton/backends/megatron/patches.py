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
from baton.core.quiet import Quiet, QuietPatch, no_nvidia_device

if TYPE_CHECKING:
    from baton.core.backend import Backend
    from baton.core.driver_view import DriverView

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

    def apply(self, driver: DriverView, recorder: PatchRecorder) -> None:
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


@register_patch
class MegatronQuiet(QuietPatch):
    """Hide Megatron-Core's notes that concern baton's code, not the run (each with its reason)."""

    name = "megatron_quiet"
    backend = "megatron"
    distribution = "megatron-core"
    versions = VERSIONS
    quiet = (
        Quiet(
            "GPTModel IS DEPRECATED",
            logger="megatron.core.models.gpt.gpt_model",
            reason="baton's backend builds GPTModel; moving to HybridModel is baton's change "
            "to make, the model trains the same",
        ),
        Quiet(
            "MimoModelConfig is experimental",
            category=UserWarning,
            module=r"megatron\.core\.models\.mimo",
            reason="printed when megatron.core imports its multimodal package; baton never uses it",
        ),
        Quiet(
            "full scope is deprecated",
            category=UserWarning,
            module=r"megatron\.core\.transformer\.transformer_config",
            reason="TransformerConfig's own default (cuda_graph_modules='full') triggers it; "
            "baton sets no CUDA graph scope",
        ),
        Quiet(
            "MCore's async save is deprecated",
            logger="megatron.core.dist_checkpointing.strategies.torch",
            reason="baton schedules Megatron's asynchronous save itself (a thread on CPU); "
            "the NVRx strategy it points to is not installed with baton",
        ),
        Quiet(
            "DistributedDataParallel: full_param_layout not provided",
            logger="megatron.core.distributed.distributed_data_parallel",
            reason="baton builds DDP with the distributed optimizer and lets Megatron compute "
            "the parameter layout, the same one it would pass",
        ),
        Quiet(
            "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
            category=UserWarning,
            # on CPU the call runs through baton's device mode (megatron/cpu.py)
            module=r"megatron\.|baton\.backends\.megatron\.cpu",
            reason="the distributed optimizer's gradient hooks read .grad of parameter views "
            "in Megatron-Core's own code",
        ),
        *(
            Quiet(
                f"`torch.distributed.{collective}` is deprecated",
                category=FutureWarning,
                module=r"torch\.distributed\.c10d_logger",
                reason="Megatron-Core's distributed optimizer calls the collective torch "
                "renamed; baton calls neither",
            )
            for collective in ("reduce_scatter_tensor", "all_gather_into_tensor")
        ),
        Quiet(
            "torch.distributed is disabled, unavailable or uninitialized, assuming the intent "
            "is to load in a single process",
            category=UserWarning,
            module=r"torch\.distributed\.checkpoint\.",
            reason="Megatron-Core's dist_checkpointing reads each rank's shards with "
            "torch.distributed.checkpoint.load(..., no_dist=True) on purpose: every load "
            "says it, on one rank or many",
        ),
        Quiet(
            "The argument order of load has been changed",
            category=UserWarning,
            module=r"torch\.distributed\.checkpoint\.",
            reason="Megatron-Core's dist_checkpointing passes the storage reader "
            "positionally; torch maps it to the keyword itself, the load is the same",
        ),
        Quiet(
            "Please use DTensor instead and we are deprecating ShardedTensor",
            category=FutureWarning,
            # on CPU the call runs through baton's device mode (megatron/cpu.py)
            module=r"megatron\.|baton\.backends\.megatron\.cpu",
            reason="Megatron-Core's dist_checkpointing builds ShardedTensors to load its "
            "checkpoints; baton calls no ShardedTensor API",
        ),
        Quiet(
            "The pynvml package is deprecated",
            category=FutureWarning,
            reason="Megatron's save starts a helper process that imports torch afresh, outside "
            "the filter baton's CLI installs for the same torch note",
        ),
    )


@register_patch
class MegatronQuietCpu(QuietPatch):
    """On a machine without a CUDA GPU, hide the notes that Megatron-Core falls back to torch."""

    name = "megatron_quiet_cpu"
    backend = "megatron"
    distribution = "megatron-core"
    versions = VERSIONS
    quiet = (
        Quiet(
            "Transformer Engine and Apex are not installed",
            category=UserWarning,
            module=r"megatron\.",
            reason="without a GPU the torch optimizers and kernels are the only ones that run",
        ),
        Quiet(
            "Apex is not installed. Falling back to Torch Norm",
            category=UserWarning,
            module=r"megatron\.",
            reason="without a GPU torch's LayerNorm is the one that runs",
        ),
        Quiet(
            "No CUDA runtime is found",
            logger="torch.utils.cpp_extension",
            reason="printed when megatron imports torch's extension builder on a machine "
            "without CUDA; baton builds no extension",
        ),
    )

    @classmethod
    def early_condition(cls) -> bool:
        return no_nvidia_device()

    def condition(self, backend: Backend) -> tuple[bool, str]:
        import torch

        if torch.cuda.is_available():
            return False, "a CUDA GPU is present: Transformer Engine and Apex matter there"
        return True, "no CUDA GPU"


register_patch(dcp_safe_loading("megatron"))
