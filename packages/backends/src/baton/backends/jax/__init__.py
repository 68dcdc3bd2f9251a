"""baton.backends.jax: bring your own flax model (nnx or linen) and optax optimizer.

Importing this package is cheap: it registers the backend without importing jax; jax,
flax, optax and orbax load when the backend is built. No torch is imported on this path.

Example::

    from baton.backends.jax import JaxBackend

    backend = JaxBackend(model=my_nnx_model, optimizer=optax.adam(1e-3),
                         loss_fn=my_loss, train_data=my_batches)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from baton.backends.jax.data import BatchStream, DataExhausted, DataUnavailable
from baton.backends.lazy_exports import lazy_exports
from baton.core.backend_descriptor import BackendDescriptor, declare_backend

if TYPE_CHECKING:
    from baton.backends.jax.backend import (
        BatchRejected,
        JaxBackend,
        JaxConfig,
        LossFunctionError,
    )

__all__ = [
    "BatchRejected",
    "BatchStream",
    "DataExhausted",
    "DataUnavailable",
    "JaxBackend",
    "JaxConfig",
    "LossFunctionError",
]

declare_backend(
    BackendDescriptor(
        name="jax",
        engine="baton.backends.jax.backend:JaxBackend",
        summary="Your own flax model and optax optimizer, one jitted step per baton step.",
        launcher="jax",
        objectives=("pretrain",),
        order=60,
    )
)

__getattr__ = lazy_exports(
    __name__,
    dict.fromkeys(("BatchRejected", "JaxBackend", "JaxConfig", "LossFunctionError"), "backend"),
)
