"""Run under torchrun with 2 processes: a tiny Hugging Face Llama (tied embeddings)
sharded over 2 CPU ranks (gloo) as Fabric's sharded strategies hold it (FSDP 2:
``fully_shard`` on each decoder layer, then the model; FSDP 1: ``FullyShardedDataParallel``
with ``use_orig_params``, inside the ``_FabricModule`` Fabric wraps it in), trains one SFT
backward on the full and the chunked cross entropy: the output head is replaced inside
the sharded model's own forward, where its weight is whole.

python chunked_sharded_worker.py MODE MODEL_DIR OUT

Rank 0 writes ``OUT.json``: each path's loss and gradient 2-norm (over the whole,
gathered gradient), and the unsharded model's on the full path.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel
from transformers import AutoModelForCausalLM

from baton.backends.fabric.cross_entropy import FULL, CrossEntropy
from baton.backends.fabric.posttrain import cross_entropy_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.sharded_llama import FP32, shard_like_fabric


def batch(vocab: int) -> dict[str, torch.Tensor]:
    """Two rows of two documents each, the first 3 targets of each document ignored."""
    gen = torch.Generator().manual_seed(0)
    positions = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)
    labels = torch.randint(0, vocab, (2, 24), generator=gen)
    labels[:, :3] = labels[:, 10:13] = -100
    return {
        "input_ids": torch.randint(0, vocab, (2, 24), generator=gen),
        "position_ids": positions,
        "labels": labels,
        "num_items_in_batch": (labels != -100).sum(),
    }


def grad_norm(model: torch.nn.Module, root: torch.nn.Module, mode: str) -> float:
    if mode == "fsdp1":
        assert isinstance(root, FullyShardedDataParallel)
        return float(root.clip_grad_norm_(float("inf"), norm_type=2.0))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


def main(mode: str, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    root, wrapped = shard_like_fabric(model, mode, strategy=FP32)
    rows = batch(model.config.vocab_size)
    results = {}
    for name, path in (("full", FULL), ("chunked", CrossEntropy("chunked", chunk_size=7))):
        model.zero_grad(set_to_none=True)
        loss = partial(cross_entropy_loss, cross_entropy=path)(wrapped, rows)
        loss.backward()
        results[name] = {"loss": float(loss), "grad_norm": grad_norm(model, root, mode)}
    if rank == 0:  # the same step unsharded, in one process
        whole = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        loss = cross_entropy_loss(whole, rows)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in whole.parameters()])
        results["unsharded"] = {"loss": float(loss), "grad_norm": float(norm)}
        Path(f"{out}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
