"""baton.backends.fabric: any PyTorch model through Lightning Fabric (the built-in default).
An existing ``LightningModule`` has its own backend: ``baton.backends.lightning``.

Importing this package is cheap; torch and lightning load with ``FabricBackend``.

Example::

    from baton.backends.fabric import FabricBackend, FabricConfig
    backend = FabricBackend(model=net, optimizer=lambda m: AdamW(m.parameters()), data=loader)

    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining   # the quickstart's GPT
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.fabric import patches as _patches  # noqa: F401  (registers the patches)
from baton.backends.lazy_exports import lazy_exports
from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend

if TYPE_CHECKING:
    from baton.backends.fabric.backend import FabricBackend
    from baton.backends.fabric.config import FabricConfig
    from baton.backends.fabric.models.gpt import GPTConfig, GPTTraining

__all__ = ["FabricBackend", "FabricConfig", "GPTConfig", "GPTTraining"]

declare_backend(
    BackendDescriptor(
        name="fabric",
        engine="baton.backends.fabric.backend:FabricBackend",
        summary="Your PyTorch model, optimizer and data through lightning.fabric.Fabric (DDP/FSDP, precision).",
        launcher="torchrun",
        objectives=("pretrain", "sft", "dpo", "grpo"),
        exporter="baton.backends.fabric.export:export_hf",
        compare=CompareRun(
            "hf_finetune.py",
            # its model shifts the labels itself: one token more gives --seq-len targets
            # (packed rows, read with --objective sft, hold their own seq_len + 1 tokens)
            flags=("--seq-len={window}", "--batch-size={batch}", "--eval-every=0"),
        ),
        order=10,
    )
)

__getattr__ = lazy_exports(
    __name__,
    {
        "FabricBackend": "backend",
        "FabricConfig": "config",
        "GPTConfig": "models.gpt",
        "GPTTraining": "models.gpt",
    },
)
