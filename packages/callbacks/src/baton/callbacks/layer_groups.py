"""Sums of squares per layer group, for the callbacks that report norms of the model.

Written once against the array API standard (``array_namespace``): the arrays stay the
backend's own (torch tensors, JAX arrays) and the sums stay lazy on the device::

    squares = squares_by_group({"net.0.weight": w0, "net.2.weight": w2}, depth=2)
    # {"net.0": sum(w0 * w0), "net.2": sum(w2 * w2)}, in float32 at least
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from array_api_compat import array_namespace


def group_of(name: str, depth: int) -> str:
    """The first ``depth`` dot-separated parts of ``name`` (``net.0.weight`` -> ``net.0``)."""
    return ".".join(name.split(".")[:depth])


def square_sum(value: Any) -> Any:
    """``sum(value * value)`` on the device, accumulated in at least float32."""
    xp = array_namespace(value)
    if value.dtype not in (xp.float32, xp.float64):
        value = xp.astype(value, xp.float32)
    return xp.sum(value * value)


def squares_by_group(
    arrays: Mapping[str, Any],
    depth: int,
    *,
    keep: Callable[[str], bool] = lambda _: True,
    square: Callable[[Any], Any] = square_sum,
) -> dict[str, Any]:
    """``{group: sum of square(array)}`` over the named arrays that ``keep`` accepts."""
    out: dict[str, Any] = {}
    for name, value in arrays.items():
        if not keep(name):
            continue
        group = group_of(name, depth)
        part = square(value)
        out[group] = out[group] + part if group in out else part
    return out


def total(values: Iterable[Any]) -> Any:
    """The sum of lazy scalars (``0.0`` for none)."""
    result: Any = 0.0
    for value in values:
        result = value + result
    return result
