"""TorchTitan's notes about settings baton owns, hidden (each exact, with its reason)."""

from __future__ import annotations

from baton.backends.torchtitan.patches.common import VERSIONS
from baton.core.quiet import Quiet, QuietPatch

#: TorchTitan logs on the root logger (``torchtitan.tools.logging``)
TORCHTITAN_LOGGER = "root"


class TorchTitanQuiet(QuietPatch):
    """Hide TorchTitan's notes about settings baton owns (each with its reason)."""

    name = "torchtitan_quiet"
    backend = "torchtitan"
    distribution = "torchtitan"
    versions = VERSIONS
    quiet = (
        Quiet(
            "initial_load_model_only=True has no effect without an initial_load_path",
            logger=TORCHTITAN_LOGGER,
            reason="TorchTitan's own checkpoint default; baton starts from a checkpoint with "
            "--resume or --init-from, not through initial_load_path",
        ),
        Quiet(
            "model.safetensors.index.json not found at hf_assets_path",
            logger=TORCHTITAN_LOGGER,
            reason="hf_assets_path is the tokenizer's directory; the index only matters "
            "for saving TorchTitan checkpoints in Hugging Face format, which baton never "
            "does (baton export writes its own)",
        ),
        Quiet(
            "torch.distributed is already initialized. Skipping init_distributed.",
            logger=TORCHTITAN_LOGGER,
            reason="baton creates the process group from the launch before TorchTitan builds",
        ),
        Quiet(
            "Error running lspci:",
            logger=TORCHTITAN_LOGGER,
            reason="TorchTitan asks lspci for the GPU model to estimate MFU; without lspci it "
            "uses the device name, which is what baton reports",
        ),
        Quiet(
            "Peak flops undefined for: cpu,",
            logger=TORCHTITAN_LOGGER,
            reason="a CPU has no peak-flops entry: MFU on CPU means nothing either way "
            "(an unknown GPU still shows the note)",
        ),
        Quiet(
            "In CPU autocast, but the target dtype is not supported. Disabling autocast.",
            category=UserWarning,
            module=r"torch\.amp",
            reason="TorchTitan's MoE router asks autocast for float32 scores; CPU autocast "
            "takes only bfloat16 and float16 and steps aside, so the router computes in its "
            "inputs' dtype (float32 in a CPU run, what it asked for)",
        ),
        Quiet(
            "To get the last learning rate computed by the scheduler, please use `get_last_lr()`",
            category=UserWarning,
            module=r"torch\.optim\.lr_scheduler",
            reason="on resume TorchTitan's LRSchedulersContainer.load_state_dict recomputes "
            "each LambdaLR's last learning rate with get_lr(), outside a step, as it means to; "
            "the schedule continues from the restored step",
        ),
        Quiet(
            "torch.distributed is disabled, unavailable or uninitialized, assuming the intent "
            "is to load in a single process",
            category=UserWarning,
            module=r"torch\.distributed\.checkpoint\.",
            reason="baton reads a TorchTitan checkpoint in one process where no process group "
            "exists (baton export, a start from a checkpoint's weights): one process is the "
            "intent",
        ),
        Quiet(
            "DTensor random operators may not have complete support on cpu device mesh",
            category=UserWarning,
            module=r"torch\.distributed\.tensor",
            reason="torch's note for a CPU mesh; baton seeds and checkpoints the RNG itself",
        ),
    )
