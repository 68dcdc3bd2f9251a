"""``gpu_speed.py``'s ``megatron-bare`` row: the Megatron-Core step that baton's
``megatron`` row drives (the same recipe, model and data), run by a bare loop as
``native.py`` runs it, logging once (the last step's fetch) as baton's run does.

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "bf16-mixed", cuda=False)
    megatron_bare(setting)   # Measured(seconds_per_step=0.17, ..., paths="layers=local")
"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_speed_baton import megatron_driver, megatron_measured
from benchmarks.gpu_speed_measure import Measured
from benchmarks.gpu_speed_setting import Setting


def megatron_bare(setting: Setting) -> Measured:
    from benchmarks.native import native_seconds_per_step

    window, backend = setting.window(), megatron_driver(setting).backend

    def bare(backend: Any, steps: int) -> float:
        for step in range(1, steps + 1):
            window.begin(step - 1)
            output = backend.train_step(step)
            if step == steps:  # the one log step, as baton's run has
                backend.fetch(output.lazy_values())
            window.end(step)
        return window.per_step()

    seconds = native_seconds_per_step(backend, bare, setting.shape.steps)
    return megatron_measured(setting.inputs, seconds, backend)
