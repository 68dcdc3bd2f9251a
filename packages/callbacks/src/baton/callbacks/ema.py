"""An exponential moving average of the weights, kept on the device beside them.

Example::

    Driver(backend, callbacks=[EMA(decay=0.999), Checkpoint(every_n_steps=500)])
    Driver(backend, callbacks=[EMA(decay=0.999, use_for_eval=True)], eval_every=100)

    uv run baton export runs/x/checkpoints/latest --format hf exported/ --ema

After every step (from ``start_step`` on) each parameter's average becomes
``decay * average + (1 - decay) * weight``; the first update copies the weights. The
averages are the backend's own arrays, one per piece this rank holds (sharded as the
weights are), computed through the array API standard on any backend with the
``model_state`` ability; nothing is fetched to the host while training.

- Checkpoints: every checkpoint carries the averages in ``ema/`` beside ``backend/``
  (``ModelState.save_arrays``: one safetensors file per rank with each piece's place in
  its whole tensor), and a resume reads them back (``load_arrays``), so a resumed run
  continues the average bit for bit.
- Evaluation: with ``use_for_eval`` the model evaluates with the averages (swapped in at
  ``on_eval_start``, the trained weights swapped back at ``on_eval_end``).
- Export: ``baton export CKPT --format hf OUT --ema`` writes the averages in Hugging Face
  format (for a model-spec or ``transformers`` run).

Metric keys logged: none. State (``state_key="ema"``): the decay, the number of updates
and the averages' directory in the checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from array_api_compat import array_namespace

from baton.core.abilities import Ability
from baton.core.callback import Callback
from baton.core.metrics import StepOutput
from baton.core.model_state import ModelState
from baton.core.registry import CALLBACKS

if TYPE_CHECKING:
    from baton.core import DriverView

#: the averages' folder inside a checkpoint (beside ``backend/``)
EMA_DIR = "ema"


def copy_of(value: Any) -> Any:
    """A copy of an array on its device (torch or JAX alike)."""
    return array_namespace(value).asarray(value, copy=True)


@CALLBACKS.register("ema")
class EMA(Callback):
    """Keep ``decay * average + (1 - decay) * weights`` after every step.

    Args:
        decay: weight of the running average at each update, in [0, 1).
        start_step: the first step averaged (the weights are copied there).
        use_for_eval: evaluate with the averaged weights (swapped back afterwards).
    """

    state_key = "ema"

    def __init__(self, decay: float = 0.999, *, start_step: int = 0, use_for_eval: bool = False):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.start_step = start_step
        self.use_for_eval = use_for_eval
        self.updates = 0
        self.averages: dict[str, Any] = {}
        self._state: ModelState | None = None
        self._restored = False
        self._trained: dict[str, Any] | None = None

    def requires(self) -> frozenset[Ability]:
        return frozenset({"model_state"})

    def on_setup(self, driver: DriverView) -> None:
        self._state = driver.backend.model_state()

    def on_step_end(self, driver: DriverView, output: StepOutput) -> None:
        if driver.step <= self.start_step or self._state is None:
            return
        pieces = self._state.parameters()
        if not self.averages:
            self.averages = {p.name: copy_of(p.value) for p in pieces}
        else:
            keep, take = self.decay, 1.0 - self.decay
            for piece in pieces:
                self.averages[piece.name] = self.averages[piece.name] * keep + piece.value * take
        self.updates += 1

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "arrays": EMA_DIR}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        self._restored = self.updates > 0

    def on_save_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        directory = driver.checkpoint_being_written
        if self.averages and self._state is not None and directory is not None:
            self._state.save_arrays(directory / EMA_DIR, self.averages)

    def on_load_checkpoint(self, driver: DriverView, checkpoint: dict[str, Any]) -> None:
        if not self._restored or self._state is None or driver.resumed_from is None:
            return
        self._restored = False
        self.averages = self._state.load_arrays(driver.resumed_from / EMA_DIR)

    # -- evaluation with the averages -----------------------------------------------------
    def on_eval_start(self, driver: DriverView) -> None:
        if not (self.use_for_eval and self.averages and self._state is not None):
            return
        self._trained = {p.name: copy_of(p.value) for p in self._state.parameters()}
        self._state.assign(self.averages)

    def on_eval_end(self, driver: DriverView, metrics: dict[str, float]) -> None:
        if self._trained is not None and self._state is not None:
            self._state.assign(self._trained)
            self._trained = None
