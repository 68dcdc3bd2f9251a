"""A tiny Hugging Face Llama sharded over this process group's CPU ranks as Fabric's
sharded strategies hold it, for the torchrun workers that check code on sharded weights:
FSDP 2 (``fully_shard`` on each decoder layer, then the model) or FSDP 1
(``FullyShardedDataParallel`` with ``use_orig_params``, each decoder layer its own unit),
inside the ``_FabricModule`` Fabric wraps it in.

Example::

    dist.init_process_group("gloo")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root, wrapped = shard_like_fabric(model, "fsdp2", strategy=FP32)
    loss = cross_entropy_loss(wrapped, rows)      # through Fabric's wrapper
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from lightning.fabric.plugins import Precision
from lightning.fabric.wrappers import _FabricModule  # pyright: ignore[reportPrivateUsage]
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

#: what ``_FabricModule.forward`` reads of its strategy: fp32, no autocast
FP32: Any = SimpleNamespace(precision=Precision())


def shard_like_fabric(
    model: torch.nn.Module, mode: str, *, strategy: Any = None
) -> tuple[Any, Any]:
    """``(the sharded root module, the _FabricModule around it)`` of ``model`` sharded
    over the process group's ranks; ``mode``: ``fsdp2`` or ``fsdp1``; ``strategy``: what
    the wrapper's forward reads (``FP32``, or None for a wrapper only unwrapped)."""
    if mode == "fsdp2":
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        layers: Any = model.model.layers  # pyright: ignore[reportAttributeAccessIssue]
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        root = fully_shard(model, mesh=mesh)
        return root, _FabricModule(model, strategy=strategy)
    policy = ModuleWrapPolicy({LlamaDecoderLayer})
    root = FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu")
    )
    return root, _FabricModule(root, strategy=strategy, original_module=model)
