"""The model's quantities a parallel layout splits, checked before any framework is built.

Tensor parallelism splits attention heads and key/value heads, pipeline parallelism
splits layers into stages, expert parallelism splits the experts. A degree that does not
divide its quantity is refused in one line that names the quantity and the degrees that
fit, not in whatever the framework asserts first::

    from baton.core.model.parallel_layout import check_parallel_layout

    check_parallel_layout(heads=32, kv_heads=8, layers=32, tp=3)
    # UsageError: --tp 3 does not divide the model's 32 attention heads; use a --tp that
    #             divides 32: 1, 2, 4, 8, 16, 32
"""

from __future__ import annotations

from baton.core.errors import UsageError


def divisors(number: int) -> list[int]:
    """The divisors of ``number`` in increasing order: ``divisors(12) == [1, 2, 3, 4, 6, 12]``."""
    return [d for d in range(1, number + 1) if number % d == 0]


def check_divides(flag: str, degree: int, quantity: int | None, what: str) -> None:
    """Refuse ``degree`` (``--tp``...) when it does not divide ``quantity`` (None: unknown)."""
    if quantity is None or degree <= 1 or quantity % degree == 0:
        return
    fits = ", ".join(str(d) for d in divisors(quantity))
    raise UsageError(
        f"{flag} {degree} does not divide the model's {quantity} {what}; use a {flag} that "
        f"divides {quantity}: {fits}"
    )


def check_parallel_layout(
    *,
    heads: int | None = None,
    kv_heads: int | None = None,
    layers: int | None = None,
    experts: int | None = None,
    tp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    ep: int = 1,
) -> None:
    """Heads and key/value heads by ``tp``, layers by ``pp`` (times ``vpp`` model chunks
    a stage; pass ``layers=None`` for a framework that splits layers unevenly), experts by
    ``ep``; ``UsageError`` naming the first quantity that does not divide."""
    check_divides("--tp", tp, heads, "attention heads")
    check_divides("--tp", tp, kv_heads, "key/value heads")
    if vpp > 1 and layers is not None and layers % (pp * vpp):
        raise UsageError(
            f"--pp {pp} x --vpp {vpp} model chunks do not divide the model's {layers} layers; "
            f"choose --pp and --vpp whose product divides {layers}: "
            + ", ".join(str(d) for d in divisors(layers))
        )
    check_divides("--pp", pp, layers, "layers")
    check_divides("--ep", ep, experts, "experts")
