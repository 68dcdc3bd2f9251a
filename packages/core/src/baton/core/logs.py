"""baton's log lines: everything from rank 0, only warnings and errors from other ranks.

Under torchrun or SLURM every rank runs the same loop, so every ``log.info`` would
appear once per rank. ``setup_logging`` keeps rank 0's lines as they are and lets the
other ranks through only at ``WARNING`` and above, prefixed with their rank::

    from baton.core.logs import setup_logging

    setup_logging()               # reads the rank from baton.core.launch.Launch
    # rank 0: "checkpoint runs/x/checkpoints/step_000100 saved (every 100 steps)"
    # rank 3: "[rank 3] log sink 'wandb' failed to open ..." (warnings only)

``BATON_LOG_ALL_RANKS=1`` shows every rank's lines at ``INFO`` (each prefixed).

On a terminal lines are rich (time, level, wrapped to the window); written to a file or
a pipe (a SLURM log, CI) each record is one plain line, never wrapped mid-message.
"""

from __future__ import annotations

import logging
import os
import sys

from rich.logging import RichHandler

from baton.core.launch import Launch

LOGGER = "baton"


def setup_logging(launch: Launch | None = None) -> logging.Logger:
    """Point the ``baton`` logger at the console for this process's rank."""
    launch = Launch.from_env() if launch is None else launch
    handler: logging.Handler
    if sys.stdout.isatty():
        handler = RichHandler(show_path=False, markup=False, rich_tracebacks=False)
        prefix = ""
    else:
        handler = logging.StreamHandler(sys.stdout)
        prefix = "[%(asctime)s] %(levelname)-7s "
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [handler]
    logger.propagate = False
    if launch.rank == 0:
        handler.setFormatter(logging.Formatter(prefix + "%(message)s", "%H:%M:%S"))
        logger.setLevel(logging.INFO)
        return logger
    handler.setFormatter(
        logging.Formatter(prefix + f"[rank {launch.rank}] %(message)s", "%H:%M:%S")
    )
    every_rank = os.environ.get("BATON_LOG_ALL_RANKS", "") not in ("", "0")
    logger.setLevel(logging.INFO if every_rank else logging.WARNING)
    return logger
