"""One error line per launch: under torchrun, the ranks that stop on the same error print
it once, the first rank that has it, and torchrun's failure report names it.

Every rank of a ``torchrun`` job runs the same checks, so a bad flag stops them all with
the same message. torchrun gives each worker an error file (``TORCHELASTIC_ERROR_FILE``,
``<log_dir>/<run_id>/attempt_<n>/<local_rank>/error.json``) and, when workers fail,
prints a report whose root cause is the failure with the earliest error-file time.
``claim`` decides, through a file created atomically in the attempt's directory (which
the ranks of a node share), which rank prints:

- the first rank to claim a message prints it and writes it to its error file, so the
  report's root cause reads the message (not "To enable traceback see ...");
- a later rank with the same message prints nothing and writes an error file saying
  that it stopped on that error, timed after the first (the root cause stays the first);
- a later rank with another message prints its own.

Exit statuses are untouched (torchrun's report lists each rank's). Outside torchrun (no
error file) every process prints, as before. On several nodes each node's first rank
prints (the ranks of a node share the directory, nodes do not).

Example (what ``baton``'s command does with a one-line error)::

    if claim("baton: --batch-size must be > 0, got 0"):
        print("baton: --batch-size must be > 0, got 0", file=sys.stderr)
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

#: the file (in torchrun's attempt directory) holding the first rank's message
CLAIM_FILE = "baton-error.json"


def _error_file() -> Path | None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    return Path(path) if path and path != os.devnull else None


def _rank() -> str:
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "?"))


def _write_json(path: Path, value: dict[str, object]) -> None:
    """``value`` as ``path``, written whole (a reader never sees half of it)."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
        json.dump(value, out)
    os.replace(out.name, path)


def claim(message: str) -> bool:
    """Whether this process should print ``message`` (see the module docstring); writes
    torchrun's error file under torchrun. Never raises: on any trouble, print."""
    error_file = _error_file()
    if error_file is None:
        return True
    try:
        shared = error_file.parent.parent  # attempt_<n>: every local rank's directory's parent
        now = time.time()
        mine = {"message": message, "rank": _rank(), "timestamp": int(now)}
        with tempfile.NamedTemporaryFile("w", dir=shared, delete=False, suffix=".tmp") as out:
            json.dump(mine, out)
        try:
            os.link(out.name, shared / CLAIM_FILE)  # atomic: exactly one rank creates it
            first = mine
        except FileExistsError:
            first = json.loads((shared / CLAIM_FILE).read_text())
        finally:
            os.unlink(out.name)
        if first is mine or first.get("message") != message:
            _write_json(error_file, {"message": message, "timestamp": int(now)})
            return True
        later = max(int(now), int(first.get("timestamp", 0)) + 1)  # the first stays the root
        _write_json(
            error_file,
            {
                "message": f"stopped on the same error as rank {first.get('rank', '?')} "
                "(printed once, by that rank)",
                "timestamp": later,
            },
        )
        return False
    except (OSError, ValueError):
        return True


__all__ = ["CLAIM_FILE", "claim"]
