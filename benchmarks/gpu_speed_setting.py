"""What every ``gpu_speed.py`` row runs under: the inputs, the precision, the device, a
fresh run directory per row and the window of timed steps; the learning rate all rows
share and the Qwen3 as a ``transformers`` model.

Example::

    setting = Setting(Inputs(Path("/tmp/g"), TINY), "bf16-mixed", cuda=False)
    setting.window()            # Window(3, 5): steps 3-5 of 5 timed
    setting.run_dir("fabric")   # /tmp/g/runs/fabric-XXXXXXXX, a new one each call
    load_qwen3(setting.inputs)  # the random-weight Qwen3, fp32, on the CPU
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_speed_inputs import Inputs, Shape
from benchmarks.gpu_speed_measure import Window

#: every row's learning rate
LR = 1e-5


@dataclass(frozen=True)
class Setting:
    """The inputs, ``precision`` (``bf16-mixed`` or ``32-true``) and device of one run."""

    inputs: Inputs
    precision: str
    cuda: bool

    @property
    def shape(self) -> Shape:
        return self.inputs.shape

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16-mixed"

    @property
    def accelerator(self) -> str:
        """``cuda`` or ``cpu``: the recipes' ``--accelerator`` and torch's device type."""
        return "cuda" if self.cuda else "cpu"

    def window(self) -> Window:
        """A window over the shape's timed steps."""
        return Window(self.shape.timed_from, self.shape.steps)

    def run_dir(self, name: str) -> Path:
        """A new directory ``name-XXXXXXXX`` under the inputs' ``runs``."""
        scratch = self.inputs.root / "runs"
        scratch.mkdir(exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))


def load_qwen3(inputs: Inputs) -> Any:
    """The inputs' Qwen3 as a ``transformers`` model in fp32, on the CPU."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(inputs.qwen3(), dtype=torch.float32)
