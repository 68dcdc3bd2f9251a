"""baton.backends.maxtext: MaxText's jitted JAX train step driven by baton's loop.

Importing this package is cheap: it registers the backend and its patches without
importing jax or maxtext (MaxText's import takes 20-40 s); they load in ``setup``.

Example::

    from baton.backends.maxtext import MaxTextBackend, MaxTextConfig, TINY_CPU

    backend = MaxTextBackend(overrides=TINY_CPU | {"steps": 50})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.lazy_exports import lazy_exports
from baton.backends.maxtext import moe_metrics as _moe_metrics  # registers its patch
from baton.backends.maxtext import objective_loss as _objective_loss  # registers its patch
from baton.backends.maxtext import patches as _patches  # registers the patches (no jax)
from baton.backends.maxtext.config import TINY_CPU, MaxTextConfig, per_device_batch
from baton.core.backend_descriptor import BackendDescriptor, CompareRun, declare_backend

if TYPE_CHECKING:
    from baton.backends.maxtext.backend import MaxTextBackend

__all__ = ["TINY_CPU", "MaxTextBackend", "MaxTextConfig", "per_device_batch"]

del _patches, _moe_metrics, _objective_loss

declare_backend(
    BackendDescriptor(
        name="maxtext",
        engine="baton.backends.maxtext.backend:MaxTextBackend",
        summary="MaxText's jitted JAX train step, one call per baton step.",
        launcher="jax",
        objectives=("pretrain", "sft", "dpo", "grpo"),
        exporter="baton.backends.maxtext.export:export_hf",
        compare=CompareRun(
            "maxtext_tiny.py",
            flags=(
                "--seq-len={seq_len}",
                "--batch-size={batch}",
                "--eval-every=0",
                "--no-async-save",
                "--no-progress",
                "--overrides",
                "dtype=float32",
            ),
        ),
        order=50,
    )
)


__getattr__ = lazy_exports(__name__, {"MaxTextBackend": "backend"})
