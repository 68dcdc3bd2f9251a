"""Llama 3 8B with TorchTitan on 8 GPUs (FSDP, bf16, optional torch.compile) through baton.

torchrun --nproc-per-node 8 -m baton.core.cli run recipes/torchtitan_llama3_8b.py --compile
uv run baton run recipes/torchtitan_llama3_8b.py --dry-run       # on CPU: validate and plan

The config is TorchTitan's own ``llama3_8b()`` (C4 from the Hugging Face hub and the
Llama 3.1 tokenizer from ``--hf-assets-path``); ``--dry-run`` needs neither: it checks
the parallelism against ``--gpus`` ranks, builds the model on the meta device and
prints the plan, then returns without training.
"""

from __future__ import annotations

from baton.backends.torchtitan import TorchTitanBackend
from baton.callbacks import standard_callbacks
from baton.core import Driver


def recipe(
    max_steps: int = 1000,
    gpus: int = 8,
    dp_shard: int = -1,
    tp: int = 1,
    batch_size: int = 1,
    seq_len: int = 8192,
    lr: float = 3e-4,
    compile: bool = False,
    async_checkpoint: str = "async",
    hf_assets_path: str = "./assets/hf/Llama-3.1-8B",
    log_every: int = 10,
    run_dir: str = "runs/torchtitan_llama3_8b",
    dry_run: bool = False,
) -> Driver | None:
    """Llama 3 8B pre-training with FSDP over ``gpus`` ranks (``dp_shard=-1``: all of them)."""
    from torchtitan.models.llama3.config_registry import llama3_8b

    from baton.backends.torchtitan.plan import parallelism_plan

    config = llama3_8b()
    config.hf_assets_path = hf_assets_path
    config.dump_folder = f"{run_dir}/torchtitan"
    config.training.steps = max_steps
    config.training.local_batch_size = batch_size
    config.training.seq_len = seq_len
    config.training.mixed_precision_param = "bfloat16"
    config.parallelism.data_parallel_shard_degree = dp_shard
    config.parallelism.tensor_parallel_degree = tp
    for group in config.optimizer.param_groups:
        group.optimizer_kwargs["lr"] = lr
    config.compile.enable = compile
    config.checkpoint.async_mode = async_checkpoint
    config.metrics.log_freq = log_every
    if dry_run:
        print(parallelism_plan(config, world_size=gpus), flush=True)
        return None
    return Driver(
        TorchTitanBackend(config),
        standard_callbacks(async_save=async_checkpoint != "disabled"),
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
    )
