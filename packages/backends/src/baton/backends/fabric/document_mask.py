"""The packed documents' block mask for ``transformers``' ``flex_attention``, built by
baton from the rows' restarting ``position_ids`` without waiting for the device.

Given ``position_ids`` and no attention mask, ``transformers`` finds the documents of
packed rows itself (``masking_utils.find_packed_sequence_indices``) and asks the device
whether any row holds more than one (``bool(tensor)``): a host synchronisation in every
forward pass. ``DocumentBlockMask``, a forward pre-hook on the model, hands the model
the same mask instead, built on the device as a ``BlockMask`` (each token sees the
earlier tokens of its own document; a document starts where the position does not
follow the previous one, the rule ``transformers`` applies), which ``transformers``
passes to every attention layer as it is. It acts only on the calls ``transformers``
would look for packed documents in (``position_ids``, no attention mask, no KV cache,
``use_cache=False``), and is installed only on models whose layers all attend fully
(a sliding-window layer needs its own mask).

Example::

    model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
    use_document_block_mask(model)          # True: installed
    model(input_ids=ids, position_ids=positions, use_cache=False)   # no host sync for the mask
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Each token's document in its row (0, 1, ...): a document starts where the
    position is not the previous one plus 1."""
    previous = position_ids[:, :1] - 1
    starts = torch.diff(position_ids, prepend=previous, dim=-1) != 1
    return starts.cumsum(-1)


@functools.cache
def _compiled_create_block_mask() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def document_block_mask(position_ids: torch.Tensor) -> Any:
    """The ``BlockMask`` of packed rows with restarting ``position_ids`` (``[B, T]``):
    causal inside each document, nothing across documents."""
    documents = document_ids(position_ids)

    def same_document_causal(batch: Any, head: Any, query: Any, key: Any) -> Any:
        return (documents[batch, query] == documents[batch, key]) & (key <= query)

    rows, length = position_ids.shape
    make = _compiled_create_block_mask()
    return make(same_document_causal, rows, None, length, length, device=position_ids.device)


class DocumentBlockMask:
    """A forward pre-hook (``with_kwargs=True``) giving a packed call its documents'
    ``BlockMask`` as ``attention_mask`` (see the module docs)."""

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        positions = kwargs.get("position_ids")
        ids = kwargs.get("input_ids")
        packed_call = (
            not args
            and isinstance(positions, torch.Tensor)
            and isinstance(ids, torch.Tensor)
            and kwargs.get("attention_mask") is None
            and kwargs.get("past_key_values") is None
            and kwargs.get("use_cache") is False
        )
        if not packed_call:
            return None
        assert isinstance(positions, torch.Tensor) and isinstance(ids, torch.Tensor)
        positions = positions.expand(ids.shape[0], -1)
        return args, {**kwargs, "attention_mask": document_block_mask(positions)}


def attends_fully(model: nn.Module) -> bool:
    """Whether every layer of a ``transformers`` model attends to all earlier tokens
    (no sliding-window or other layer type needing its own mask)."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or ("full_attention",)
    return all(kind == "full_attention" for kind in layer_types)


def use_document_block_mask(model: nn.Module) -> bool:
    """Install ``DocumentBlockMask`` on ``model`` when its layers all attend fully;
    returns whether it did."""
    if not attends_fully(model):
        return False
    model.register_forward_pre_hook(DocumentBlockMask(), with_kwargs=True)
    return True
