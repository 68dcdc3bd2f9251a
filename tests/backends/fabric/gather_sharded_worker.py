"""Run under torchrun with 2 processes: ``gathered_weights.gather_hf_weights`` of a tiny
Hugging Face Llama (tied embeddings) sharded over 2 CPU ranks (gloo), as Fabric's sharded
strategies hold it: FSDP 2 (``fully_shard`` on each decoder layer, then the model) or
FSDP 1 (``FullyShardedDataParallel`` with ``use_orig_params``, each decoder layer its
own unit) inside the ``_FabricModule`` Fabric wraps it in.

python gather_sharded_worker.py MODE MODEL_DIR OUT

Rank 0 writes the gathered weights to ``OUT.safetensors``; every rank writes
``OUT.rank<r>.json`` (whether it got weights).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from baton.backends.fabric.gathered_weights import gather_hf_weights
from baton.backends.fabric.runtime import TrainingParts

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.sharded_llama import shard_like_fabric


def main(mode: str, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _, wrapped = shard_like_fabric(model, mode)
    parts = TrainingParts(raw_model=model, model=wrapped, optimizers=())
    weights = gather_hf_weights(parts, sharded=True, rank=rank)
    if weights is not None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, f"{out}.safetensors")
    Path(f"{out}.rank{rank}.json").write_text(json.dumps({"gathered": weights is not None}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
