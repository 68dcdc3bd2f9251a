"""What a run leaves beside its checkpoints: ``run.json`` (how it was started) and
``patches.json`` (which patches applied), both written by rank 0.

``run.json`` holds the resolved settings and limits, the backend (name, version,
``describe()``, the parallel layout its checkpoints record), its native config, the
callbacks, the command line, working directory, git commit, package versions, host,
world size, launch and the checkpoint the run resumed from::

    write_run_record(run_dir, options=driver.options, backend=backend,
                     callbacks=driver.callbacks, resumed_from=None)
    json.loads((run_dir / RUN_RECORD).read_text())["git"]   # {"commit": ..., "dirty": False}

``versions(backend)`` is recorded in each checkpoint too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baton.core.backend import Backend, installed_version
from baton.core.callback import Callback
from baton.core.checkpoints.files import write_json_atomic
from baton.core.json_values import json_value
from baton.core.launch import Launch
from baton.core.options import RunOptions
from baton.core.patches import PatchDecision

log = logging.getLogger("baton")

#: the run record written at start, beside ``patches.json``
RUN_RECORD = "run.json"
#: which patches applied and why, written after ``backend.setup``
PATCH_REPORT = "patches.json"
#: distributions whose versions each run and checkpoint record when installed
RECORDED_DISTRIBUTIONS = (
    "baton-core",
    "baton-callbacks",
    "baton-backends",
    "torch",
    "jax",
    "lightning",
)


def versions(backend: Backend) -> dict[str, str]:
    """Python's, the backend's and baton's and the frameworks' installed versions."""
    found = {"python": platform.python_version(), backend.name: backend.version}
    for dist in RECORDED_DISTRIBUTIONS:
        if (installed := installed_version(dist)) is not None:
            found[dist] = installed
    return found


def git_state() -> dict[str, Any] | None:
    """The commit (and whether the work tree had changes) when run inside a git repo."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def write_patch_report(
    run_dir: Path, backend: Backend, report: Sequence[PatchDecision], *, write: bool
) -> None:
    """``run_dir/patches.json`` (when ``write``: rank 0), one log line summarising it
    (``patch_summary``) and, at ``--verbose`` (the ``baton`` logger at ``DEBUG``), one
    line per patch. Called after ``setup``, when the backend knows its rank."""
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            run_dir / PATCH_REPORT,
            {
                "backend": backend.name,
                "version": backend.version,
                "patches": [dataclasses.asdict(d) for d in report],
            },
        )
    for decision in report:
        log.debug(
            "patch %-32s %s (%s)",
            decision.name,
            "applied" if decision.applied else "skipped",
            decision.reason,
        )
    if report:
        log.info("%s", patch_summary(report, run_dir / PATCH_REPORT))


def patch_summary(report: Sequence[PatchDecision], details: Path) -> str:
    """One line for the patches a run applied, names sharing a prefix folded into one
    ``prefix_*`` (``patch_names``).

    >>> from baton.core.patches import PatchDecision as D
    >>> patch_summary([D("megatron_cpu_streams", True, ""), D("megatron_cpu_device", True, ""),
    ...                D("megatron_quiet", True, ""), D("megatron_tp_fix", False, "")],
    ...               Path("runs/a/patches.json"))
    'patches: 3 applied (megatron_cpu_*, megatron_quiet), 1 skipped; details in runs/a/patches.json'
    """
    applied = [d.name for d in report if d.applied]
    skipped = len(report) - len(applied)
    names = f" ({', '.join(patch_names(applied))})" if applied else ""
    tail = f", {skipped} skipped" if skipped else ""
    return f"patches: {len(applied)} applied{names}{tail}; details in {details}"


def patch_names(names: Sequence[str]) -> list[str]:
    """``names`` in order, those sharing their first two words (``megatron_cpu``) as one
    ``megatron_cpu_*``.

    >>> patch_names(["megatron_cpu_streams", "megatron_cpu_device", "megatron_quiet",
    ...              "megatron_quiet_cpu", "dcp_safe_loading"])
    ['megatron_cpu_*', 'megatron_quiet*', 'dcp_safe_loading']
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault("_".join(name.split("_")[:2]), []).append(name)
    folded: list[str] = []
    for prefix, members in groups.items():
        if len(members) == 1:
            folded.append(members[0])
        else:
            folded.append(prefix + ("*" if prefix in members else "_*"))
    return folded


def write_run_record(
    run_dir: Path,
    *,
    options: RunOptions,
    backend: Backend,
    callbacks: Sequence[Callback],
    resumed_from: Path | None,
) -> None:
    """``run_dir/run.json``, written once the run is about to train (call it on rank 0).
    A run that stops before its first checkpoint still leaves it; a run refused at
    start leaves the last one as it was."""
    record = {
        "settings": options.settings,
        "limits": {
            **options.limits(),
            "log_every": options.log_every,
            "eval_every": options.eval_every,
        },
        "backend": {"name": backend.name, "version": backend.version, **backend.describe()},
        "layout": dict(backend.checkpoint_facts().layout) or None,
        "native_config": json_value(backend.config, native=True),
        "callbacks": [repr(cb) for cb in callbacks],
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "git": git_state(),
        "versions": versions(backend),
        "host": socket.gethostname(),
        "world_size": backend.world_size,
        "launch": dataclasses.asdict(Launch.from_env()),
        "started_at": time.time(),
        "resumed_from": None if resumed_from is None else str(resumed_from),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / RUN_RECORD, record)
