"""TorchTitan 0.3 fixes as patches: CPU device, CPU attention, process-wide state.

Each patch is a callback with a version range and an undo (``baton.core.patches``).
They register when ``baton.backends.torchtitan`` is imported; nothing here imports
torch or torchtitan at module level, so listing them is cheap::

    baton patches --backend torchtitan
    BATON_PATCHES=all,-torchtitan_restore_process_state baton run recipes/torchtitan_llama3_debug.py

``torchtitan_cpu_device``, ``torchtitan_cpu_attention`` and
``torchtitan_gloo_fsdp_sum_reduction`` apply only when no accelerator is present;
``torchtitan_fsdp_partial_dtensor`` on multi-rank runs under torch 2.13;
``torchtitan_pipeline_microbatch_step`` with pipeline parallelism under torch 2.13;
``torchtitan_restore_process_state`` and ``torchtitan_chat_template_generation`` (chat
templates with ``{% generation %}`` tags) apply always.

One module per concern: :mod:`.cpu` (device and attention on CPU),
:mod:`.process_state`, :mod:`.distributed` (torch 2.13's collectives and FSDP),
:mod:`.pipeline`, :mod:`.tokenizer`, :mod:`.quiet`; they register here, in this order.
"""

from __future__ import annotations

from baton.backends.dcp_safety import dcp_safe_loading
from baton.backends.torchtitan.patches.common import VERSIONS
from baton.backends.torchtitan.patches.cpu import (
    DEVICE_COPIES,
    TorchTitanCpuAttention,
    TorchTitanCpuDevice,
    cpu_device_module,
)
from baton.backends.torchtitan.patches.distributed import (
    TORCH_WITHOUT_SPMD_FSDP,
    TorchTitanFsdpPartialDtensor,
    TorchTitanGlooFsdpSumReduction,
    TorchTitanPgSetTimeout,
)
from baton.backends.torchtitan.patches.pipeline import TorchTitanPipelineMicrobatchStep
from baton.backends.torchtitan.patches.process_state import (
    TORCHTITAN_ENV,
    TorchTitanRestoreProcessState,
)
from baton.backends.torchtitan.patches.quiet import TORCHTITAN_LOGGER, TorchTitanQuiet
from baton.backends.torchtitan.patches.tokenizer import TorchTitanChatTemplateGeneration
from baton.core.patches import register_patch

__all__ = [
    "DEVICE_COPIES",
    "TORCHTITAN_ENV",
    "TORCHTITAN_LOGGER",
    "TORCH_WITHOUT_SPMD_FSDP",
    "VERSIONS",
    "TorchTitanChatTemplateGeneration",
    "TorchTitanCpuAttention",
    "TorchTitanCpuDevice",
    "TorchTitanFsdpPartialDtensor",
    "TorchTitanGlooFsdpSumReduction",
    "TorchTitanPgSetTimeout",
    "TorchTitanPipelineMicrobatchStep",
    "TorchTitanQuiet",
    "TorchTitanRestoreProcessState",
    "cpu_device_module",
]

#: registration order (``baton patches`` and ``patches.json`` list them in it)
for _patch in (
    TorchTitanCpuDevice,
    TorchTitanCpuAttention,
    TorchTitanRestoreProcessState,
    TorchTitanPgSetTimeout,
    TorchTitanFsdpPartialDtensor,
    TorchTitanGlooFsdpSumReduction,
    TorchTitanPipelineMicrobatchStep,
    TorchTitanChatTemplateGeneration,
    TorchTitanQuiet,
):
    register_patch(_patch)
register_patch(dcp_safe_loading("torchtitan"))
