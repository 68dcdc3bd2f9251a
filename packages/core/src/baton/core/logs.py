"""baton's log lines: everything from rank 0, only warnings and errors from other ranks.

Under torchrun or SLURM every rank runs the same loop, so every ``log.info`` would
appear once per rank. ``setup_logging`` keeps rank 0's lines as they are and lets the
other ranks through only at ``WARNING`` and above, prefixed with their rank::

    from baton.core.logs import setup_logging

    setup_logging()               # reads the rank from baton.core.launch.Launch
    # rank 0: "checkpoint runs/x/checkpoints/step_000100 saved (every 100 steps)"
    # rank 3: "[rank 3] log sink 'wandb' failed to open ..." (warnings only)

``BATON_LOG_ALL_RANKS=1`` shows every rank's lines at ``INFO`` (each prefixed);
``setup_logging(level=logging.DEBUG)`` (``--verbose``) adds baton's detail lines.

The user's own loggers print the same way: a recipe's (or its package's)
``logging.getLogger("my_recipe").info(...)`` shows on rank 0 like baton's lines. Code
is the user's when its file is outside the installed packages and the standard library
(``own_code``); installed libraries keep Python's default (warnings and errors only, on
stderr), so torch's, JAX's or Megatron's own INFO lines stay quiet.

On a terminal lines are rich (time, level, wrapped to the window); written to a file or
a pipe (a SLURM log, CI) each record is one plain line, never wrapped mid-message.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
from pathlib import Path

from rich.logging import RichHandler

from baton.core.launch import Launch

LOGGER = "baton"

#: where installed code lives: its loggers are libraries', not the user's
_INSTALLED = tuple(
    {
        str(Path(p).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)


def own_code(record: logging.LogRecord) -> bool:
    """Whether a record was logged by the user's code (a recipe, its package), not by
    an installed library or the standard library."""
    path = record.pathname
    if not path or path.startswith("<"):
        return False
    resolved = str(Path(path).resolve())
    return not resolved.startswith(_INSTALLED) and "site-packages" not in resolved


class _OwnCode(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return own_code(record)


class _Libraries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not own_code(record)


class _Stderr(logging.Handler):
    """Python's last resort for libraries' warnings: the message alone, on the current
    stderr (a handler on the root logger turns the last resort off)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.addFilter(_Libraries())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _route_own_loggers(handler: logging.Handler, level: int) -> None:
    """Let the user's loggers through ``handler`` at ``level`` via the root logger, and
    libraries' warnings to stderr as before."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if (h.get_name() or "").startswith(LOGGER + ".")]:
        root.removeHandler(old)
    handler.setLevel(level)
    handler.addFilter(_OwnCode())
    handler.set_name(LOGGER + ".own_code")
    libraries = _Stderr()
    libraries.set_name(LOGGER + ".libraries")
    root.addHandler(handler)
    root.addHandler(libraries)
    if root.level == logging.NOTSET or root.level > level:
        root.setLevel(level)


def _console_handler(rank: int) -> logging.Handler:
    """One line per record: rich on a terminal, plain in a file or pipe; other ranks'
    lines prefixed with the rank."""
    handler: logging.Handler
    if sys.stdout.isatty():
        handler = RichHandler(show_path=False, markup=False, rich_tracebacks=False)
        prefix = ""
    else:
        handler = logging.StreamHandler(sys.stdout)
        prefix = "[%(asctime)s] %(levelname)-7s "
    rank_prefix = "" if rank == 0 else f"[rank {rank}] "
    handler.setFormatter(logging.Formatter(prefix + rank_prefix + "%(message)s", "%H:%M:%S"))
    return handler


def setup_logging(launch: Launch | None = None, level: int = logging.INFO) -> logging.Logger:
    """Point the ``baton`` logger, and the user's own loggers, at the console for this
    process's rank. ``level`` is rank 0's for baton's lines (``logging.DEBUG`` at
    ``--verbose``: every patch applied, ...); the user's loggers print from ``INFO``."""
    launch = Launch.from_env() if launch is None else launch
    every_rank = os.environ.get("BATON_LOG_ALL_RANKS", "") not in ("", "0")
    shown = launch.rank == 0 or every_rank
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [_console_handler(launch.rank)]
    logger.propagate = False
    logger.setLevel(level if shown else logging.WARNING)
    _route_own_loggers(_console_handler(launch.rank), logging.INFO if shown else logging.WARNING)
    return logger
