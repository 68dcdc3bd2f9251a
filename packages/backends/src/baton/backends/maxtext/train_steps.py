"""Which train step a MaxText run takes: MaxText's own jitted step, the same step
without donating the state (once, after a background save), or the controlled step
once a callback on the model asked for more (``model_state.py``). The backend owns one
``TrainSteps``, built in ``setup`` from the step parts, MaxText's jitted step and a
getter of the current train state; the checkpoint I/O asks it to keep the state once
and for the hyperparameters callbacks set.

Example::

    steps = TrainSteps(parts, jitted_train_step, lambda: engine.state)
    state, metrics = steps.run(state, batch)        # inside the mesh
    steps.keep_state_next_step()                    # a background save reads the state
    lr = steps.lr_metric(index)                     # computed when fetched
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from baton.backends.maxtext.background_save import train_step_keeping_state
from baton.backends.maxtext.model_state import MaxTextModelState
from baton.backends.maxtext.step_parts import StepParts


class TrainSteps:
    """The choice of step function for one set-up MaxText run, and its model-state view.

    ``plain`` is MaxText's jitted ``train_step`` (the state donated); ``state`` returns
    the run's current train state (for the model-state view).
    """

    def __init__(
        self, parts: StepParts, plain: Callable[..., Any], state: Callable[[], Any]
    ) -> None:
        self._parts = parts
        self._plain = plain
        self._state = state
        #: the train step without donation, for the step after a background save
        self._keeping: Callable[..., Any] | None = None
        self._keep_state_once = False  # the next step must leave the state valid
        self._model_state: MaxTextModelState | None = None

    # -- the model-state view ---------------------------------------------------------
    def model_state(self) -> MaxTextModelState:
        """Parameters by name, gradients, learning rate and freezing (built at first use)."""
        if self._model_state is None:
            self._model_state = MaxTextModelState(self._state, self._parts)
        return self._model_state

    def _controlled(self) -> MaxTextModelState | None:
        """The model-state view once a callback asked for the controlled step."""
        view = self._model_state
        return view if view is not None and view.active else None

    # -- the step ---------------------------------------------------------------------
    def keep_state_next_step(self) -> None:
        """The next step leaves the state's arrays valid (not donated): a background
        save still reads them."""
        self._keep_state_once = True

    def run(self, state: Any, batch: Any) -> tuple[Any, Any]:
        """One step on ``state`` (call inside the mesh): the controlled step once a
        callback watches gradients, froze or set a hyperparameter, else MaxText's;
        without donating the state when a background save reads it."""
        keep, self._keep_state_once = self._keep_state_once, False
        controlled = self._controlled()
        if controlled is not None:
            return controlled.train(state, batch, donate=not keep)
        train = self._train_keeping_state() if keep else self._plain
        return train(state, batch)

    def _train_keeping_state(self) -> Callable[..., Any]:
        if self._keeping is None:
            self._keeping = train_step_keeping_state(self._parts)
        return self._keeping

    def lr_metric(self, index: int) -> Callable[[], Any]:
        """The learning rate of MaxText's 0-based step ``index``, computed when fetched
        (the schedule times the factor a callback set)."""
        controlled = self._controlled()
        if controlled is not None:
            return controlled.lr_metric(index)
        return partial(self._parts.lr_at, index)

    # -- what a checkpoint records beside MaxText's state -------------------------------
    def hyperparameters_set(self) -> dict[str, Any]:
        """For a checkpoint's ``hyperparameters.json``: the learning-rate factor and weight
        decay set by callbacks (nothing when no callback used ``model_state``)."""
        if self._model_state is None:
            return {}
        return {"hyperparameters": self._model_state.hyperparameters()}

    def restore_hyperparameters_set(self, meta: Mapping[str, Any]) -> None:
        """What ``hyperparameters_set`` returned when the checkpoint was written."""
        if "hyperparameters" in meta:
            self.model_state().restore_hyperparameters(meta["hyperparameters"])
