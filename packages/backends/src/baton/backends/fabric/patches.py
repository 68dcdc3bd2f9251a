"""Lightning Fabric's notes that concern baton's code, not the run, hidden from the console.

A run of several processes (``FabricConfig(devices=2)``, or under torchrun) has every
rank announce itself as it joins the process group, and rank 0 print a framed block
saying the group is complete. baton already says where a run goes (``run.json``, the
``done:`` line with the world size in ``baton.json``); a failed join still raises.
This module imports neither torch nor lightning.

    baton patches --backend fabric           # lists it
    BATON_PATCHES=all,-fabric_quiet baton run recipes/quickstart.py   # shows the banner
"""

from __future__ import annotations

from baton.core.patches import register_patch
from baton.core.quiet import Quiet, QuietPatch

#: the frame Lightning draws around its "processes registered" block
_RULE = "-" * 100
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)


@register_patch
class FabricQuiet(QuietPatch):
    """Hide Lightning's process-group banner on multi-process runs (each with its reason)."""

    name = "fabric_quiet"
    backend = "fabric"
    distribution = "lightning"
    versions = ">=2.6,<2.7"
    quiet = (
        Quiet(
            "Initializing distributed: GLOBAL_RANK:",
            logger="lightning.fabric.utilities.distributed",
            reason="one line per rank as it joins the process group, before training; a rank "
            "that cannot join raises with its own message",
        ),
        *(
            Quiet(
                f"{_RULE}\ndistributed_backend=",
                logger=logger,
                reason="rank 0's framed block saying every process joined; the world size is "
                "in run.json and each checkpoint's baton.json",
            )
            # Lightning's rank-zero messages go to the logger of whichever of its packages
            # loaded last: lightning.pytorch's once ``import lightning`` ran
            for logger in _RANK_ZERO_LOGGERS
        ),
    )
