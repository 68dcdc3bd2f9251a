"""Blends of prepared datasets: ``"0.7 data/web 0.3 data/code"`` or one prefix.

The text is Megatron's ``--data-path`` convention: either prefixes alone (equal weights)
or weight/prefix pairs. Weights are relative (they need not sum to 1).

Example::

    from baton.data import parse_blend

    blend = parse_blend("0.7 data/web 0.3 data/code")
    blend.prefixes, blend.weights        # ("data/web", "data/code"), (0.7, 0.3)
    blend.normalized_weights()           # (0.7, 0.3)
    blend.megatron()                     # (["data/web", "data/code"], [0.7, 0.3]): a GPTDataset blend
    blend.maxtext()                      # "data/web,0.7;data/code,0.3": MaxText's grain_train_files
    parse_blend("data/web").weights      # None: one dataset, or equal weights
    blend.check_exists()                 # DataError naming a prefix without .bin/.idx
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from baton.data.errors import DataError
from baton.data.manifest import split_prefix


@dataclass(frozen=True)
class Blend:
    """Prepared dataset prefixes and their relative weights (None: all equal)."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None = None

    def normalized_weights(self) -> tuple[float, ...]:
        """Weights summing to 1 (equal weights when none were given)."""
        weights = self.weights or (1.0,) * len(self.prefixes)
        total = sum(weights)
        return tuple(weight / total for weight in weights)

    def megatron(self) -> tuple[list[str], list[float] | None]:
        """Megatron-Core's blend: ``(prefixes, weights or None)``, as ``GPTDatasetConfig.blend``."""
        return list(self.prefixes), None if self.weights is None else list(self.weights)

    def maxtext(self) -> str:
        """MaxText's ``grain_train_files`` for ``grain_file_type=mmap``: ``"A,0.7;B,0.3"``.

        One dataset is its prefix alone; prefixes without weights get equal weights.
        """
        if len(self.prefixes) == 1:
            return self.prefixes[0]
        weights = self.weights or (1.0,) * len(self.prefixes)
        return ";".join(f"{p},{w:g}" for p, w in zip(self.prefixes, weights, strict=True))

    def check_exists(self) -> None:
        """Open each prefix's index and data; :class:`DataError` names the first that fails."""
        from baton.data.indexed import PreparedDataset

        for prefix in self.prefixes:
            PreparedDataset(prefix)

    def __str__(self) -> str:
        if self.weights is None:
            return " ".join(self.prefixes)
        return " ".join(f"{w:g} {p}" for w, p in zip(self.weights, self.prefixes, strict=True))


def _weight(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def parse_blend(spec: str | Sequence[str]) -> Blend:
    """Parse ``"PREFIX"``, ``"PREFIX_A PREFIX_B"`` or ``"W_A PREFIX_A W_B PREFIX_B"``.

    A list of words (Megatron's ``--data-path`` after the shell split it) works too.
    Raises :class:`DataError` for an empty blend, a weight that is not a positive finite
    number, a weight without a prefix, or weights given for only some prefixes.
    """
    words = spec.split() if isinstance(spec, str) else [str(word) for word in spec]
    shown = spec if isinstance(spec, str) else " ".join(words)
    if not words:
        raise DataError("the data path is empty; pass a prepared prefix or 'W1 PREFIX1 W2 PREFIX2'")
    numeric = [_weight(word) is not None for word in words]
    if not any(numeric):
        return Blend(tuple(split_prefix(word) for word in words))
    if len(words) % 2 or not all(numeric[0::2]) or any(numeric[1::2]):
        raise DataError(
            f"blend {shown!r} does not parse: give prefixes alone ('data/a data/b') or "
            "weight/prefix pairs ('0.7 data/a 0.3 data/b'), each weight a number"
        )
    weights = tuple(float(word) for word in words[0::2])
    for word, weight in zip(words[0::2], weights, strict=True):
        if not math.isfinite(weight) or weight <= 0:
            raise DataError(f"blend {shown!r}: weight {word!r} must be a positive finite number")
    return Blend(tuple(split_prefix(word) for word in words[1::2]), weights)
