"""The batches a TorchTitan run reads, rebuilt outside the run for comparisons."""

from __future__ import annotations

import torch


def first_byte_batch(
    seq_len: int, batch_size: int, dp_world_size: int = 1, dp_rank: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``(inputs, labels)`` a fresh byte-level run reads (baton's packed
    reference text through TorchTitan's data loader), on data-parallel rank ``dp_rank``."""
    from baton.backends.torchtitan.configs import dataloader_config
    from baton.backends.torchtitan.data import ByteBosEosTokenizer

    loader = dataloader_config(None, seed=0).build(
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        tokenizer=ByteBosEosTokenizer(),
        seq_len=seq_len,
        local_batch_size=batch_size,
    )
    inputs, labels = next(iter(loader))
    return inputs["input"], labels
