"""Array math the objectives' losses share, written once against the array API standard
(``xp`` is ``array_api_compat.array_namespace`` of the inputs: torch in the torch
engines, ``jax.numpy`` inside MaxText's jitted step, numpy on the host).

Per-document sums go through a one-hot membership ``[B, T, D]`` (elementwise, no scatter
and no matmul: the same operations on every framework, and no reduced-precision dot).

Example::

    xp = array_namespace(logps)
    sums = document_sums(xp, logps * mask, segments, 4)       # [B, 4]
    back = to_tokens(xp, sums, segments, 4)                   # [B, T]: each token's document's
"""

from __future__ import annotations

from typing import Any

import array_api_compat


def as_float(xp: Any, values: Any) -> Any:
    """``values`` as float32 (booleans to 0/1)."""
    return xp.astype(values, xp.float32)


def membership(xp: Any, segments: Any, num_documents: int) -> Any:
    """``[B, T, D]`` float32: 1 where target ``t`` of row ``b`` belongs to document
    ``d + 1`` (segment 0, padding, belongs to none)."""
    where: Any = array_api_compat.device(segments)  # pyright: ignore[reportUnknownMemberType]
    ids = xp.arange(1, num_documents + 1, dtype=segments.dtype, device=where)
    return as_float(xp, segments[..., None] == ids)


def document_sums(xp: Any, values: Any, segments: Any, num_documents: int) -> Any:
    """``[B, D]``: the sum of ``values`` ``[B, T]`` over each document's targets."""
    return xp.sum(values[..., None] * membership(xp, segments, num_documents), axis=1)


def to_tokens(xp: Any, per_document: Any, segments: Any, num_documents: int) -> Any:
    """``[B, T]``: each target's document's value of ``per_document`` ``[B, D]`` (0 on
    padding)."""
    member = membership(xp, segments, num_documents)
    return xp.sum(member * per_document[:, None, :], axis=2)


def softplus(xp: Any, values: Any) -> Any:
    """``log(1 + exp(values))``, stable for large magnitudes (``-log_sigmoid(-x)``), with
    the gradient ``sigmoid(values)`` everywhere: ``logaddexp(0, x)``, whose derivative each
    framework defines at a tie (at 0 a formula over ``abs`` and ``maximum`` has JAX's
    subgradients, 1 and 1/2, and a gradient of 0 where DPO starts: policy = reference)."""
    return xp.logaddexp(xp.zeros_like(values), values)


def present_documents(xp: Any, documents: Any) -> Any:
    """``[B, D]`` float32: 1 where the row holds document ``d + 1``."""
    return as_float(xp, documents >= 0)
