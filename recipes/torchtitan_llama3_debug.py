"""TorchTitan's llama3 debug model (6.2 M parameters) trained on CPU through baton's loop.

uv run baton run recipes/torchtitan_llama3_debug.py --max-steps 20
uv run baton run recipes/torchtitan_llama3_debug.py --max-steps 40 --resume auto

Data: the Python language reference that ships with CPython, byte-tokenized (no
downloads). Checkpoints: TorchTitan's DCP CheckpointManager under
``<run-dir>/checkpoints/step_NNNNNN``, every ``--save-every`` steps and at the end.
"""

from __future__ import annotations

from baton.backends.torchtitan import TorchTitanBackend
from baton.backends.torchtitan.configs import llama3_debug
from baton.callbacks import standard_callbacks
from baton.core import Driver


def recipe(
    max_steps: int = 20,
    lr: float = 8e-4,
    batch_size: int = 4,
    seq_len: int = 128,
    seed: int = 0,
    log_every: int = 5,
    save_every: int = 10,
    async_checkpoint: str = "disabled",
    data_path: str | None = None,
    run_dir: str = "runs/torchtitan_llama3_debug",
    progress: bool = True,
) -> Driver:
    """Train TorchTitan's llama3 debug model on CPU (or GPU) with TorchTitan's own train step."""
    config = llama3_debug(
        steps=max_steps,
        seq_len=seq_len,
        local_batch_size=batch_size,
        seed=seed,
        dump_folder=f"{run_dir}/torchtitan",
        dataset_path=data_path,
        log_freq=log_every,
    )
    for group in config.optimizer.param_groups:
        group.optimizer_kwargs["lr"] = lr
    config.checkpoint.async_mode = async_checkpoint  # "disabled", "async", "async_with_pinned_mem"
    callbacks = standard_callbacks(
        save_every=save_every, async_save=async_checkpoint != "disabled", progress=progress
    )
    return Driver(
        TorchTitanBackend(config),
        callbacks,
        max_steps=max_steps,
        log_every=log_every,
        run_dir=run_dir,
    )
