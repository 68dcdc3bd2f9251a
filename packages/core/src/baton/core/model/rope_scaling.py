"""Llama 3.1-style rotary frequency scaling, the ``rope_scaling`` of a :class:`ModelSpec`
(:mod:`baton.core.model.spec`, which re-exports it).

Example::

    from baton.core.model.rope_scaling import RopeScaling

    scaling = RopeScaling.from_hf_dict(
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        source="config.json",
    )                                    # RopeScaling(factor=8.0, ...); None for "default"
    scaling.to_hf()                      # {"rope_type": "llama3", "factor": 8.0, ...}
    scaling.refuse_unless({"factor": 8.0}, backend="maxtext")  # UsageError if it differs
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from baton.core.errors import UsageError

#: the rotary types a Llama spec builds (Hugging Face's ``rope_type``)
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1-style rotary frequency scaling (Hugging Face ``rope_type: "llama3"``):
    frequencies whose wavelength exceeds ``original_max_position_embeddings /
    low_freq_factor`` are divided by ``factor``, those under ``original_max_position_embeddings
    / high_freq_factor`` are kept, and the band between is interpolated.

    Llama 3.1's values are ``RopeScaling(8.0, 1.0, 4.0, 8192)``; Llama 3.2's factor is 32.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise UsageError(
                f"model spec: rope_scaling factor must be positive, got {self.factor!r}"
            )
        if not self.high_freq_factor > self.low_freq_factor > 0:
            raise UsageError(
                "model spec: rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor!r} and {self.low_freq_factor!r}"
            )
        original: Any = self.original_max_position_embeddings  # as read from JSON
        if not isinstance(original, int) or isinstance(original, bool) or original <= 0:
            raise UsageError(
                "model spec: rope_scaling original_max_position_embeddings must be a positive "
                f"integer, got {original!r}"
            )

    @classmethod
    def from_hf_dict(cls, scaling: dict[str, Any], *, source: str) -> RopeScaling | None:
        """The scaling of a ``config.json``'s ``rope_scaling`` or ``rope_parameters``
        (``None`` for plain rotary positions); any other ``rope_type`` is a ``UsageError``
        naming it."""
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise UsageError(
                f"{source}: rope_type {rope_type!r} is not supported; supported: 'default' "
                "(plain rotary positions) and 'llama3' (Llama 3.1-style rope_scaling)"
            )
        if rope_type == "default":
            return None
        missing = [field.name for field in fields(cls) if field.name not in scaling]
        if missing:
            raise UsageError(f"{source}: rope_scaling of type 'llama3' needs {', '.join(missing)}")
        return cls(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``rope_scaling`` entry of a ``config.json``."""
        return {"rope_type": "llama3", **asdict(self)}

    def refuse_unless(self, fixed: dict[str, Any], *, backend: str) -> None:
        """Raise ``UsageError`` naming every value that differs from ``fixed``: the values
        ``backend`` cannot set (they are constants of its rotary embedding)."""
        differ = [name for name, value in fixed.items() if getattr(self, name) != value]
        if differ:
            have = ", ".join(f"{name}={getattr(self, name)!r}" for name in differ)
            need = ", ".join(f"{name}={fixed[name]!r}" for name in differ)
            raise UsageError(
                f"{backend} cannot build this rope_scaling: it has {have}, and {backend} "
                f"fixes {need}; train this model on TorchTitan or Fabric (any llama3 scaling)"
            )
