"""How far a JAX-backend run has trained: the host's counts of optimizer steps and
samples, which the backend advances, a checkpoint saves and a resume restores.

Example::

    progress = TrainProgress()
    progress.steps_done += 1
    progress.samples_consumed += 32      # every process's samples of the step together
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainProgress:
    """The host's copy of the optimizer step count and the training samples drawn."""

    #: optimizer steps taken (the train state's ``step``, kept on the host)
    steps_done: int = 0
    #: training samples drawn by every process together (the data position)
    samples_consumed: int = 0
