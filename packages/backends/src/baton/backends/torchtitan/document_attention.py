"""Attention that never crosses a packed document, where FlexAttention cannot train.

TorchTitan's language models attend ``block_causal``: ``Trainer.post_dataloading_process``
turns the batch's ``positions`` (0 at every document start) into an attention mask, a
FlexAttention ``BlockMask`` or, for its varlen backend, ``VarlenMetadata`` (the
cumulative document starts over the flattened batch). FlexAttention has no backward on
CPU (torch 2.13), and TorchTitan's plain SDPA backend takes no mask at all.

``DocumentSdpa`` is the inner attention the ``torchtitan_cpu_attention`` patch puts in
FlexAttention's place for post-training data on CPU. Its config is a
``VarlenAttention.Config``, so TorchTitan itself builds the document metadata from the
positions, exactly where and as it does for its varlen backend; the module turns those
document starts into a dense causal-within-document mask and runs
``F.scaled_dot_product_attention`` with it. Queries see keys ``j <= i`` of their own
document only, as FlexAttention's ``block_causal`` mask allows.

Example::

    attention = DocumentSdpa.Config().build()
    out = attention(q, k, v, attention_masks=create_varlen_metadata_for_document(positions))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata
from torchtitan.protocols.module import Module


def document_causal_mask(starts: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """``[batch, 1, length, length]`` bool: query ``i`` sees key ``j`` iff ``j <= i`` and
    both lie in one document. ``starts`` are the documents' first indices over the
    flattened ``batch * length`` tokens, ending with ``batch * length`` (TorchTitan's
    ``cu_seq_q``)."""
    tokens = torch.arange(batch * length, device=starts.device, dtype=starts.dtype)
    document = torch.searchsorted(starts, tokens, right=True).view(batch, length)
    same = document[:, :, None] == document[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=starts.device).tril()
    return (same & causal)[:, None]


class DocumentSdpa(Module):
    """SDPA under TorchTitan's packed-document mask (``block_causal``), for CPU training."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: VarlenMetadata,
        scale: float | None = None,
        enable_gqa: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        if not isinstance(attention_masks, VarlenMetadata):
            raise TypeError(
                "DocumentSdpa needs TorchTitan's document metadata (VarlenMetadata): the "
                f"batch must carry positions; got {type(attention_masks).__name__}"
            )
        batch, length = q_BLNH.shape[:2]
        mask = document_causal_mask(attention_masks.cu_seq_q, batch, length)
        out = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)
