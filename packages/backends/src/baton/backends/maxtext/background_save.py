"""MaxText's own checkpoint save, written on a background thread (CPU).

An asynchronous orbax save still does its bookkeeping in the loop: the Linen-layout
state dict, a checkpointer per directory, the device-to-host copy, the directory and
metadata set-up. On a CPU machine that blocked the loop for 35-50 ms per 118 MB save,
about a tenth of a synchronous save. ``BackgroundSaves`` moves the whole call to
``checkpointing.save_checkpoint`` onto one writer thread instead. It needs no copy of
the state: JAX arrays never change, so the thread may read this step's arrays for as
long as it likes, provided the next train step does not donate them. The backend calls
that one step through ``train_step_keeping_state`` (MaxText's train step jitted
without donation, compiled once, at the first such save); every other step donates as
MaxText's own loop does. The data iterator's position is taken in the loop
(``frozen_iterator``). The backend uses orbax's own asynchronous save instead on
accelerators, where keeping a second state costs device memory, and with several JAX
processes: orbax synchronises them with collectives, which on a thread interleave with
the training loop's own collectives in a different order on each process (gloo then
fails with "Received data size doesn't match expected size").

Example::

    saves = BackgroundSaves()  # baton.backends.async_save
    pending = saves.submit(lambda: write(directory, state))
    ...                      # training continues; the next step must not donate state
    pending.wait()           # re-raises what the write raised
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from baton.backends.maxtext.step_parts import StepParts


class FrozenIteratorState:
    """A Grain iterator's state taken at save time, saved later from the writer thread.

    MaxText's ``GrainCheckpointable`` writes ``get_state()`` of an iterator with no
    ``save`` method as text: the same ``process_<i>-of-<n>.json`` file, with the same
    content, that Grain's own ``save`` writes, so MaxText restores it as usual.
    """

    def __init__(self, iterator: Any) -> None:
        import grain

        state = iterator.get_state()
        if isinstance(iterator, grain.DatasetIterator):
            state = json.dumps(state, indent=4).encode()  # what Grain's save writes
        self._state: bytes = state

    def get_state(self) -> bytes:
        return self._state


def frozen_iterator(data_iterator: Any, expansion_factor_real_data: int) -> Any:
    """What to hand ``save_checkpoint`` as the data iterator from the writer thread:
    ``None`` without a Grain iterator, a ``FrozenIteratorState`` of one local Grain
    iterator. Raises ``NotImplementedError`` for the layouts only MaxText's own save
    handles (several iterators per process, elastic or remote iterators)."""
    if data_iterator is None:
        return None
    import grain
    from maxtext.common.grain_utility import ElasticIterator, RemoteIteratorWrapper

    local = getattr(data_iterator, "local_iterator", data_iterator)
    if (
        isinstance(data_iterator, list)
        or expansion_factor_real_data > 1
        or isinstance(local, ElasticIterator | RemoteIteratorWrapper)
        or not isinstance(local, grain.DatasetIterator | grain.DataLoaderIterator)
    ):
        raise NotImplementedError("this data iterator is saved by orbax's own async save")
    return FrozenIteratorState(local)


def train_step_keeping_state(parts: StepParts) -> Callable[..., Any]:
    """MaxText's jitted ``train.train_step`` exactly as ``train_utils.jit_train_step``
    builds it (same function, shardings and signature) except that the state is not
    donated, so the arrays given to it stay valid for the writer thread."""
    import jax
    from maxtext.trainers.pre_train import train
    from maxtext.utils import maxtext_utils, sharding

    cfg, graphdef, mesh = parts.hparams, parts.graphdef, parts.mesh
    state_shardings, params_shardings = parts.state_shardings, parts.params_shardings
    data_sharding = sharding.get_input_data_sharding(cfg, mesh, rules=cfg.logical_axis_rules)
    function, in_shardings, out_shardings, static_argnums, _donated = (
        maxtext_utils.get_functional_train_with_signature(
            train.train_step, data_sharding, state_shardings, graphdef, cfg, params_shardings
        )
    )
    return jax.jit(
        function,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        static_argnums=static_argnums,
    )


def whole_save_on_thread(device_type: str, hparams: Any, data_iterator: Any) -> bool:
    """Whether an asynchronous save can run whole on the writer thread: on CPU (a
    second state costs host memory only), in one JAX process (orbax synchronises
    processes with collectives, which on a thread would interleave with the loop's
    own in a different order on each process), with MaxText's step jitted here (not
    loaded from ``compiled_trainstep_file``) and a data iterator whose position can
    be taken in the loop."""
    import jax

    if device_type != "cpu" or jax.process_count() > 1:
        return False
    if hparams.compiled_trainstep_file:
        return False
    try:
        frozen_iterator(data_iterator, int(hparams.expansion_factor_real_data))
    except NotImplementedError:
        return False
    return True
