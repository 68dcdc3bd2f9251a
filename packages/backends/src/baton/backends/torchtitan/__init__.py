"""baton.backends.torchtitan: TorchTitan's Trainer driven step by step by baton's loop.

Importing this package is cheap (no torch, no torchtitan): it registers the backend
lazily and the TorchTitan patches (``baton patches --backend torchtitan``).

Example::

    from baton.backends.torchtitan import TorchTitanBackend
    from baton.backends.torchtitan.configs import llama3_debug
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.torchtitan import patches as patches
from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend

if TYPE_CHECKING:
    from baton.backends.torchtitan.backend import TorchTitanBackend

__all__ = ["TorchTitanBackend"]

declare_backend(
    BackendDescriptor(
        name="torchtitan",
        engine="baton.backends.torchtitan.backend:TorchTitanBackend",
        summary="TorchTitan's Trainer, one Trainer.train_step per baton step.",
        launcher="torchrun",
        objectives=("pretrain", "sft", "dpo", "grpo"),
        exporter="baton.backends.torchtitan.export:export_hf",
        compare=CompareRun(
            "torchtitan_llama3_debug.py",
            flags=("--seq-len={seq_len}", "--batch-size={batch}", "--no-progress"),
        ),
        order=30,
    )
)


__getattr__ = lazy_exports(__name__, {"TorchTitanBackend": "backend"})
