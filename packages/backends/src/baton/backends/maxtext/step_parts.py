"""What MaxText's train steps are built from once ``setup`` has run: the resolved
config, the model's structure, the mesh, the state's and parameters' shardings and the
learning-rate schedule. The backend makes one ``StepParts`` and hands it to the parts
that compile or read a step (the step chooser, the model-state view, the controlled
step, the step that keeps the state for a background save).

Example::

    parts = StepParts(hparams, graphdef, mesh, state_shardings, params_shardings,
                      schedule, lr_at=jax.jit(schedule))
    step = train_step_keeping_state(parts)
    updates = optimizer_step(state)      # the optimizer's update count (a host sync)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepParts:
    """The pieces of one set-up MaxText run that its compiled steps are made of."""

    #: MaxText's resolved config (``pyconfig.HyperParameters``)
    hparams: Any
    #: the model's and optimizer's structure (``nnx.split`` of the train state)
    graphdef: Any
    #: the device mesh
    mesh: Any
    #: the train state's shardings (after ``maybe_update_params_sharding_with_opt``)
    state_shardings: Any
    #: the parameters' shardings
    params_shardings: Any
    #: MaxText's learning-rate schedule (optimizer step -> learning rate)
    learning_rate_schedule: Callable[[Any], Any]
    #: the schedule jitted: one dispatch per logged learning rate
    lr_at: Callable[[Any], Any]


def optimizer_step(state: Any) -> int:
    """The optimizer's update count of a MaxText train state (a host sync)."""
    import jax

    return int(jax.device_get(state["optimizer"]["step"].get_value()))
