"""TorchTitan's optimizers loaded from a checkpoint that holds state for only some of
their parameters.

A parameter frozen from the first step (``Freeze``) gets no optimizer state: the
optimizer skips a parameter without a gradient, so a checkpoint saved then holds none
for it. Before a load, a fresh run's optimizers make state for every parameter
(TorchTitan's ``init_optim_state``, a step with zero gradients) and ask DCP for all of
it, which refuses the keys the checkpoint lacks (``Missing key ... .step``).
``SavedStateOnly`` stands in for the optimizers during the load and asks only for the
per-parameter state the checkpoint holds. Loading that leaves the other parameters
without state, as they were in the run that saved it (their moments and step count
start when they train again), so the resumed run goes on bit for bit.

Example (what ``TitanCheckpointIO.load`` does)::

    held = saved_keys(Path("checkpoints/step_000004/backend/step-4"))
    with optimizer_state_held(trainer.checkpointer, held):
        trainer.checkpointer.load(step=4)
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the checkpointer's name for the optimizers' state (DCP keys ``optimizer.<key>``)
OPTIMIZER = "optimizer"
#: how a per-parameter state key starts (``state.<fqn>.<name>``; the groups' settings
#: are ``param_groups.<fqn>.<name>``, saved for every parameter)
PARAMETER_STATE = "state."


def saved_keys(checkpoint: Path) -> frozenset[str]:
    """Every key of the DCP checkpoint in ``checkpoint`` (a ``step-N`` folder), from
    its metadata (``optimizer.state.layers.0.attention.wq.weight.exp_avg``...)."""
    from torch.distributed.checkpoint import FileSystemReader

    return frozenset(FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata)


class SavedStateOnly:
    """TorchTitan's ``OptimizersContainer`` as DCP loads it, its per-parameter state
    limited to the keys in ``held`` (DCP's, ``optimizer.``-prefixed); the groups'
    settings and everything else pass through."""

    def __init__(self, optimizers: Any, held: Set[str]) -> None:
        self.optimizers = optimizers
        self.held = held

    def state_dict(self) -> dict[str, Any]:
        return {
            key: value
            for key, value in self.optimizers.state_dict().items()
            if not key.startswith(PARAMETER_STATE) or f"{OPTIMIZER}.{key}" in self.held
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizers.load_state_dict(state_dict)


@contextmanager
def optimizer_state_held(checkpointer: Any, held: Set[str]) -> Iterator[None]:
    """Within: ``checkpointer`` loads the optimizers' state as ``SavedStateOnly``."""
    optimizers = checkpointer.states.get(OPTIMIZER)
    if optimizers is None:
        yield
        return
    checkpointer.states[OPTIMIZER] = SavedStateOnly(optimizers, held)
    try:
        yield
    finally:
        checkpointer.states[OPTIMIZER] = optimizers
