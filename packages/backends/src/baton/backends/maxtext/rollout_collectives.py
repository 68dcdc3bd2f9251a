"""The two collectives a MaxText run on rollouts gives the rollout phase: the policy's
weights by their Hugging Face names on the first process, and an object sent from the
first process to every other.

- ``gathered_hf_weights``: MaxText's live parameters (global JAX arrays, sharded over
  the mesh's devices and processes) gathered whole to the host of every process
  (``jax.experimental.multihost_utils.process_allgather``: a collective every process
  joins), then mapped on process 0 exactly as ``baton export`` maps a checkpoint
  (``hf.maxtext_to_hf``: scanned layers unstacked, the query kernel's folded attention
  scale taken out, experts split), so the names and shapes are those the export writes.
  No file is written.
- ``broadcast_from_first``: process 0's object pickled into bytes and sent with
  ``multihost_utils.broadcast_one_to_all`` (its size first); with one process the
  object itself.

Example::

    weights = gathered_hf_weights(state, spec)     # {"model.embed_tokens.weight": ...} or None
    batch = broadcast_from_first(batch if jax.process_index() == 0 else None)
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from baton.backends.maxtext.hf import maxtext_to_hf
from baton.core.model.spec import ModelSpec


def live_params(state: Any) -> dict[str, Any]:
    """MaxText's parameter tree of a train state (``{"decoder": ..., "token_embedder":
    ...}``, global JAX arrays)."""
    from flax import nnx

    return state["model"].filter(nnx.Param).to_pure_dict()


def gathered_hf_weights(state: Any, spec: ModelSpec) -> dict[str, np.ndarray] | None:
    """The weights of ``state`` as whole float32 tensors by Hugging Face name (``spec``'s
    architecture) on process 0, ``None`` on the others; every process must call it."""
    import jax
    from jax.experimental import multihost_utils

    whole = multihost_utils.process_allgather(live_params(state), tiled=True)
    if jax.process_index() != 0:
        return None
    return maxtext_to_hf(whole, spec)


def broadcast_from_first(obj: Any) -> Any:
    """Process 0's ``obj`` on every process (the others pass anything); every process
    must call it."""
    import jax

    if jax.process_count() == 1:
        return obj
    from jax.experimental import multihost_utils

    first = jax.process_index() == 0
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if first else None
    size = int(
        multihost_utils.broadcast_one_to_all(np.int32(0 if payload is None else payload.size))
    )
    buffer = np.zeros(size, dtype=np.uint8)
    if payload is not None:
        buffer[:] = payload
    received = multihost_utils.broadcast_one_to_all(buffer)
    return obj if first else pickle.loads(np.asarray(received).tobytes())
