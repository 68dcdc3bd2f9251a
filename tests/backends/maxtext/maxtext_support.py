"""What baton's patches do for a Driver run, for MaxText code a test calls directly."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def outside_driver() -> Iterator[None]:
    """No HLO dump (MaxText fills an empty XLA_FLAGS with dump flags) and JAX's PRNG
    implementation restored afterwards (MaxText's config init changes it)."""
    import jax

    from baton.backends.maxtext.patches import NO_DUMP_XLA_FLAGS

    prng, flags = jax.config.jax_default_prng_impl, os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = flags or NO_DUMP_XLA_FLAGS
    try:
        yield
    finally:
        jax.config.update("jax_default_prng_impl", prng)
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags
