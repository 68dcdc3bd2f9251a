"""Ready ``Trainer.Config`` trees: TorchTitan's own configs with baton's offline data.

Example::

    from baton.backends.torchtitan.configs import llama3_debug

    config = llama3_debug(steps=20, seq_len=128, local_batch_size=4, seed=0)
    config.optimizer.lr = 1e-3          # it is TorchTitan's native config tree
"""

from __future__ import annotations

from typing import Any


def llama3_debug(
    *,
    steps: int = 20,
    seq_len: int = 128,
    local_batch_size: int = 4,
    seed: int | None = 0,
    dump_folder: str = "./outputs",
    dataset_path: str | None = None,
    log_freq: int = 10,
) -> Any:
    """TorchTitan's ``llama3_debugmodel`` (6 layers, dim 256) on local text, sized for CPU.

    Changes from TorchTitan's config, each for a reason: the byte tokenizer and the
    local corpus (no hub downloads; the model's 2048-entry vocabulary covers the
    258 byte ids), no validator (it would read ``c4_validation``), fp32 parameters and
    no activation checkpointing (CPU), ``metrics.log_freq`` at baton's log cadence
    instead of 1 (TorchTitan's own metric logging syncs with the host when it logs),
    ``debug.seed`` for reproducible runs.
    """
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from baton.backends.torchtitan.data import ByteTokenizer, LocalTextDataLoader

    config = llama3_debugmodel()
    config.dump_folder = dump_folder
    config.hf_assets_path = ""
    config.tokenizer = ByteTokenizer.Config()
    config.dataloader = LocalTextDataLoader.Config(dataset_path=dataset_path, seed=seed or 0)
    config.training.steps = steps
    config.training.seq_len = seq_len
    config.training.local_batch_size = local_batch_size
    config.training.mixed_precision_param = "float32"
    config.activation_checkpoint = None
    config.validator.enable = False
    config.metrics.log_freq = log_freq
    config.debug.seed = seed
    return config
