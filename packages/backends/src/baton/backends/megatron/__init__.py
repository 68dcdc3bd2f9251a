"""baton.backends.megatron: Megatron-Core (GPTModel, DDP, optimizer, schedules) in baton's loop.

Importing this package is cheap (no torch, no megatron): it registers the backend
lazily and the CPU patches; torch and megatron load with ``MegatronBackend``.

Example::

    from baton.backends.megatron import MegatronBackend, MegatronConfig
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.megatron import patches as _patches  # noqa: F401  (registers the patches)
from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend

if TYPE_CHECKING:
    from baton.backends.megatron.backend import MegatronBackend
    from baton.backends.megatron.config import DataConfig, MegatronConfig

__all__ = ["DataConfig", "MegatronBackend", "MegatronConfig"]

declare_backend(
    BackendDescriptor(
        name="megatron",
        engine="baton.backends.megatron.backend:MegatronBackend",
        summary="Megatron-Core GPTModel, DDP, optimizer and schedules behind baton's loop.",
        launcher="torchrun",
        objectives=("pretrain", "sft", "dpo", "grpo"),
        exporter="baton.backends.megatron.export:export_hf",
        compare=CompareRun(
            "megatron_gpt_tiny.py",
            flags=(
                "--seq-len={seq_len}",
                "--batch-size={batch}",
                "--global-batch-size={batch}",
                "--eval-every=0",
                "--no-async-save",
                "--no-progress",
            ),
        ),
        order=40,
    )
)


__getattr__ = lazy_exports(
    __name__,
    {
        "MegatronBackend": "backend",
        "MegatronConfig": "config",
        "DataConfig": "config",
        "tiny_transformer_config": "config",
    },
)
