"""``fabric_no_nvml_retry``: where NVML cannot load, a Fabric or LightningModule run takes
away Lightning's ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (torch would retry loading NVML at
every optimizer step) and puts it back at teardown; ``torch.cuda.is_available()``
answers the same without it."""

from __future__ import annotations

import os

import torch

from baton.backends.fabric.patches import NVML_CHECK, FabricNoNvmlRetry, nvml_loads
from baton.backends.lightning.patches import LightningNoNvmlRetry
from baton.core.patches import PatchRecorder


def test_the_nvml_check_is_removed_for_the_run_and_restored():
    import lightning.fabric  # noqa: F401  (sets the variable)

    assert os.environ.get(NVML_CHECK) == "1"
    available = torch.cuda.is_available()
    applies, why = FabricNoNvmlRetry().condition(None)  # type: ignore[arg-type]
    assert applies is (not nvml_loads()), why
    assert LightningNoNvmlRetry.backend == "lightning"
    recorder = PatchRecorder()
    FabricNoNvmlRetry().apply(None, recorder)  # type: ignore[arg-type]
    try:
        assert NVML_CHECK not in os.environ
        assert torch.cuda.is_available() is available  # the same answer, torch's default
    finally:
        assert recorder.undo() == []
    assert os.environ.get(NVML_CHECK) == "1"
