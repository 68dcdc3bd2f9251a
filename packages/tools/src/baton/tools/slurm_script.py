"""The ``sbatch`` script ``baton submit`` writes: what a job runs and asks SLURM for.

Example::

    from baton.tools.slurm_script import JobSpec, batch_script

    spec = JobSpec(recipe="recipes/quickstart.py", recipe_args=(), backend="fabric",
                   run_dir="runs/q", nodes=2, gpus_per_node=8, time="04:00:00")
    print(batch_script(spec))   # #!/bin/bash, #SBATCH lines, then one srun of torchrun

Backends launched by torchrun (their ``BackendDescriptor.launcher``) run one ``srun`` task
per node, each a ``torchrun`` with a c10d rendezvous on the job's first node; JAX backends
one task per process. Every run gets
``--resume auto`` and ``#SBATCH --signal=USR1@LEAD`` (see :mod:`baton.tools.submit`).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

from baton.core.backend_descriptor import LAUNCHER_NAMES, Launcher, backend_descriptors

#: the launchers a SLURM job runs: torchrun per node, or one task per JAX process
SLURM_LAUNCHERS: tuple[Launcher, ...] = ("torchrun", "jax")
RDZV_PORT = 29400
#: CPU cores asked per worker (torchrun worker or JAX process) a task runs, by default
CPUS_PER_WORKER = 8
#: memory asked per worker on a node, by default (SLURM size syntax, in gigabytes)
MEM_PER_WORKER_GB = 32
#: variables the task's shell expands (each task has its own node id)
_TASK_VARIABLES = frozenset(
    {"$SLURM_NNODES", "$SLURM_NODEID", "$SLURM_JOB_ID", f"$BATON_HEAD_NODE:{RDZV_PORT}"}
)
_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$")


class SubmitError(ValueError):
    """A bad ``baton submit`` invocation; the message says what to change."""


def launched_by(launcher: Launcher) -> tuple[str, ...]:
    """The backends whose descriptor names ``launcher`` (``"torchrun"``: torch.distributed
    rendezvous, ``"jax"``: jax.distributed), in the order backends are listed."""
    return tuple(d.name for d in backend_descriptors() if d.launcher == launcher)


def check_launch(backend: str) -> None:
    """``SubmitError`` for a backend no SLURM launch starts (one that runs in one process,
    or declares no launcher), naming the backends each launch starts."""
    if not any(backend in launched_by(launcher) for launcher in SLURM_LAUNCHERS):
        known = ", ".join(
            f"{', '.join(launched_by(launcher))} ({LAUNCHER_NAMES[launcher]})"
            for launcher in SLURM_LAUNCHERS
        )
        raise SubmitError(f"backend {backend!r} has no SLURM launch; known: {known}")


@dataclass(frozen=True)
class JobSpec:
    """What the batch script runs and asks SLURM for."""

    recipe: str
    recipe_args: tuple[str, ...]
    backend: str
    run_dir: str
    nodes: int = 1
    gpus_per_node: int = 0
    procs_per_node: int = 1
    time: str = "01:00:00"
    partition: str | None = None
    account: str | None = None
    job_name: str = "baton"
    signal_lead_s: int = 120
    cpus_per_task: int | None = None
    mem: str | None = None
    output_dir: str = "."
    workdir: str = "."
    python: str = sys.executable
    extra_sbatch: tuple[str, ...] = ()

    @property
    def uses_torchrun(self) -> bool:
        return self.backend not in launched_by("jax")

    @property
    def workers_per_node(self) -> int:
        """Training processes on each node: one per GPU, else ``procs_per_node``."""
        return self.gpus_per_node or self.procs_per_node

    @property
    def tasks_per_node(self) -> int:
        """SLURM tasks on each node: one torchrun per node, else one per process."""
        return 1 if self.uses_torchrun else self.procs_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    def cpus(self) -> int:
        """``--cpus-per-task``: as given, else ``CPUS_PER_WORKER`` per worker of a task."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return CPUS_PER_WORKER * self.workers_per_node // self.tasks_per_node

    def memory(self) -> str:
        """``--mem`` (per node): as given, else ``MEM_PER_WORKER_GB`` per worker."""
        return self.mem if self.mem is not None else f"{MEM_PER_WORKER_GB * self.workers_per_node}G"


def time_limit_seconds(text: str) -> int:
    """``[D-]HH:MM:SS`` -> seconds, or ``SubmitError``."""
    match = _TIME.match(text)
    if not match:
        raise SubmitError(f"--time {text!r} is not [D-]HH:MM:SS (e.g. --time 04:00:00)")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def batch_script(spec: JobSpec) -> str:
    """The ``sbatch`` script for ``spec``."""
    limit = time_limit_seconds(spec.time)
    if spec.signal_lead_s >= limit:
        raise SubmitError(
            f"--signal-lead {spec.signal_lead_s}s is not shorter than --time {spec.time}: "
            "the job would be signalled before it starts; lower --signal-lead"
        )
    tasks_per_node = spec.tasks_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
        f"#SBATCH --time={spec.time}",
        f"#SBATCH --signal=USR1@{spec.signal_lead_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={spec.output_dir}/slurm-%j.out",
    ]
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    lines.append(f"#SBATCH --cpus-per-task={spec.cpus()}")
    lines.append(f"#SBATCH --mem={spec.memory()}")
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    if spec.account:
        lines.append(f"#SBATCH --account={spec.account}")
    lines += [f"#SBATCH {arg}" for arg in spec.extra_sbatch]
    baton = [spec.python, "-m", "baton.core.cli.command", "run", spec.recipe, *spec.recipe_args]
    baton += ["--resume", "auto"]
    if spec.uses_torchrun:
        per_node = spec.workers_per_node
        inner = [
            spec.python, "-m", "torch.distributed.run",
            "--nnodes", "$SLURM_NNODES", "--node-rank", "$SLURM_NODEID",
            "--nproc-per-node", str(per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$BATON_HEAD_NODE:{RDZV_PORT}",
            "--rdzv-id", "$SLURM_JOB_ID", "--max-restarts", "0",
            *baton[1:],
        ]  # fmt: skip
    else:
        inner = baton
    command = " ".join(_shell_word(w) for w in inner)
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(spec.workdir)}",
        'export BATON_HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'echo "baton: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on'
        ' $SLURM_JOB_NODELIST, head $BATON_HEAD_NODE"',
        # The launcher (torchrun, bash) ignores USR1 so that only the training processes,
        # whose Preemption callback saves and requeues, act on the time-limit signal.
        # srun does not inherit sbatch's --cpus-per-task (SLURM >= 22.05): name it again
        f"srun --kill-on-bad-exit=1 --cpus-per-task={spec.cpus()} bash -c "
        + shlex.quote(f'trap "" USR1; exec {command}'),
    ]
    return "\n".join(lines) + "\n"


def _shell_word(word: str) -> str:
    """Quote a word for the task's shell; the job's own variables expand there."""
    if word in _TASK_VARIABLES:
        return f'"{word}"'
    return shlex.quote(word)
