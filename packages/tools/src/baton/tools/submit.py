"""``baton submit RECIPE [recipe flags] --nodes N --gpus-per-node G --time HH:MM:SS``:
run a recipe as a SLURM batch job that saves before its time limit and requeues itself.

Example::

    baton submit recipes/torchtitan_llama3_8b.py --nodes 4 --gpus-per-node 8 \\
        --time 04:00:00 --partition gpu --run-dir runs/llama3_8b
    baton submit recipes/maxtext_tiny.py --nodes 2 --time 00:30:00 --dry-run   # print it

The job is an ``sbatch`` script (``--dry-run`` prints it and submits nothing):

- backends launched by torchrun (their ``BackendDescriptor.launcher``: fabric,
  lightning, torchtitan, megatron): one ``srun`` task per node, each running
  ``torchrun`` with a c10d rendezvous on the job's first node, one worker per GPU
  (``--procs-per-node`` on CPU);
- JAX backends (launcher ``jax``: maxtext, jax): one ``srun`` task per process
  (``--procs-per-node``, default 1 per host); each reads its rank from SLURM and joins
  ``jax.distributed`` with the first node as coordinator.

A backend that runs in one process has no SLURM launch and is refused.

The job's nodes must share a filesystem that holds the working directory, the recipe,
the Python environment and the run directory (checkpoints written by one node are read
by all after a requeue): the script ``cd``s into the submitting directory on every node.

With ``--gpus-per-node`` the recipe must train on the GPUs: a recipe with an
``accelerator`` parameter gets ``--accelerator cuda`` unless the flags name one, and a
backend configured for the CPU (``FabricConfig(accelerator="cpu")``, MaxText's
``hardware=cpu``) is refused.

SLURM gives a task one CPU core and its default memory unless asked, and one task per
node serves all of a node's torchrun workers; so each job asks for ``--cpus-per-task``
(default ``CPUS_PER_WORKER`` = 8 cores per worker the task runs: 64 for a torchrun task
over 8 GPUs) and ``--mem`` per node (default ``MEM_PER_WORKER`` = 32G per worker on
the node: 256G for 8 GPUs; ``--mem 0`` asks for all of it). Both flags override.

A recipe that plans its parallel layout (a ``dry_run`` parameter with a world size:
``--gpus``, ``--world-size`` or ``--devices``) is asked, in a process of its own, to plan
it for the job's world size (nodes x GPUs or processes per node) before any script is
written: a layout the recipe refuses (``dp_shard(10) * tp(3) != WORLD_SIZE(32)``) is
refused here with the recipe's words. ``baton submit --dry-run`` prints the script and
queues nothing; the recipe is still checked as the job will run it, training, so the
recipe's own ``--dry-run`` is never implied (a real-size recipe still wants its data).
The script's output directory (``RUN_DIR/slurm``) is created either way: SLURM opens
``--output`` before the script runs.

Every run gets ``--resume auto``. ``#SBATCH --signal=USR1@LEAD`` makes SLURM signal the
training processes ``LEAD`` seconds before the time limit; the ``Preemption`` callback
finishes the step, saves, requeues the job (``scontrol requeue``) and exits, and the
requeued job continues from that checkpoint. The recipe and its flags are checked here,
before anything is queued, so a typo fails now rather than after the queue wait.

The script is written by :mod:`baton.tools.slurm_script`, the recipe checked by
:mod:`baton.tools.submit_checks`; this module is the command line.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from baton.tools.slurm_script import (
    CPUS_PER_WORKER,
    MEM_PER_WORKER_GB,
    RDZV_PORT,
    JobSpec,
    SubmitError,
    batch_script,
    check_launch,
    launched_by,
    time_limit_seconds,
)
from baton.tools.submit_checks import (
    WORLD_SIZE_PARAMETERS,
    check_layout,
    check_recipe,
    cpu_setting,
    gpu_flags,
)

__all__ = [
    "CPUS_PER_WORKER",
    "MEM_PER_WORKER_GB",
    "RDZV_PORT",
    "WORLD_SIZE_PARAMETERS",
    "JobSpec",
    "SubmitError",
    "batch_script",
    "check_launch",
    "check_layout",
    "check_recipe",
    "cpu_setting",
    "gpu_flags",
    "launched_by",
    "main",
    "time_limit_seconds",
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baton submit",
        description="Run a recipe as a SLURM job that saves before its time limit and "
        "requeues itself. Flags not listed here go to the recipe.",
    )
    parser.add_argument("recipe", help="recipe file, e.g. recipes/quickstart.py")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (0: CPU)")
    parser.add_argument(
        "--procs-per-node",
        type=int,
        default=1,
        help="processes per node when there are no GPUs (and JAX processes per host)",
    )
    parser.add_argument("--time", default="01:00:00", help="time limit [D-]HH:MM:SS")
    parser.add_argument(
        "--cpus-per-task",
        type=int,
        help=f"CPU cores per task (default {CPUS_PER_WORKER} per worker it runs: a torchrun "
        "task per node serves all its GPU workers)",
    )
    parser.add_argument(
        "--mem",
        help=f"memory per node, SLURM syntax (default {MEM_PER_WORKER_GB}G per worker on the "
        "node; 0 for all of it)",
    )
    parser.add_argument("--partition", help="SLURM partition")
    parser.add_argument("--account", help="SLURM account")
    parser.add_argument("--job-name", help="job name (default: the recipe's name)")
    parser.add_argument(
        "--signal-lead",
        type=int,
        default=120,
        help="seconds before the time limit at which the job saves and requeues",
    )
    parser.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        help="extra #SBATCH line, e.g. --sbatch-arg=--exclusive (repeatable)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the script, queue nothing (the recipe is still checked as the job runs "
        "it, training; the recipe's own --dry-run is not implied)",
    )
    return parser


_MEM = re.compile(r"^\d+[KMGT]?$")


def _check_arguments(args: argparse.Namespace, recipe_args: Sequence[str]) -> None:
    """``SubmitError`` for counts, limits and sizes SLURM would not take, and ``--resume``."""
    for name in ("nodes", "procs_per_node"):
        if getattr(args, name) < 1:
            raise SubmitError(f"--{name.replace('_', '-')} must be >= 1")
    if args.gpus_per_node < 0 or args.signal_lead < 0:
        raise SubmitError("--gpus-per-node and --signal-lead must be >= 0")
    time_limit_seconds(args.time)
    if "--resume" in recipe_args:
        raise SubmitError("drop --resume: a SLURM job always runs with --resume auto")
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise SubmitError("--cpus-per-task must be >= 1")
    if args.mem is not None and not _MEM.match(args.mem):
        raise SubmitError(f"--mem {args.mem!r} is not SLURM's size syntax (e.g. 480G, 0)")


def _submit(sbatch: str, script: str, script_path: Path, output_dir: Path) -> int:
    """Write the batch script and hand it to ``sbatch``; 1 when it refuses."""
    output_dir.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script)
    done = subprocess.run(
        [sbatch, "--parsable", str(script_path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(f"baton submit: sbatch failed: {done.stderr.strip()}", file=sys.stderr)
        return 1
    job_id = done.stdout.strip().split(";")[0]
    print(f"submitted job {job_id}: {script_path}; output in {output_dir}/slurm-{job_id}.out")
    return 0


def _job_spec(
    args: argparse.Namespace, recipe_args: Sequence[str], backend: str, run_dir: str
) -> JobSpec:
    """The job ``baton submit``'s flags describe, for a recipe of ``backend`` writing
    to ``run_dir``; SLURM's output goes to ``run_dir/slurm``."""
    return JobSpec(
        recipe=str(Path(args.recipe).absolute()),
        recipe_args=tuple(recipe_args),
        backend=backend,
        run_dir=run_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        procs_per_node=args.procs_per_node,
        time=args.time,
        partition=args.partition,
        account=args.account,
        job_name=args.job_name or Path(args.recipe).stem,
        signal_lead_s=args.signal_lead,
        cpus_per_task=args.cpus_per_task,
        mem=args.mem,
        output_dir=str(Path(run_dir).absolute() / "slurm"),
        workdir=str(Path.cwd()),
        extra_sbatch=tuple(args.sbatch_arg),
    )


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args, recipe_args = parser.parse_known_args(list(argv))
    try:
        _check_arguments(args, recipe_args)
        recipe_args = gpu_flags(args.recipe, recipe_args, args.gpus_per_node)
        sbatch = shutil.which("sbatch")
        if sbatch is None and not args.dry_run:
            raise SubmitError(
                "sbatch is not on PATH: no SLURM client here. Run on a SLURM login node, "
                "or use --dry-run to print the script"
            )
        try:
            backend, run_dir, plans = check_recipe(args.recipe, recipe_args, args.gpus_per_node)
        except SubmitError as error:
            if not args.dry_run:
                raise
            raise SubmitError(
                f"{error} (the recipe is checked as the job will run it, training: baton "
                "submit's --dry-run only prints the script)"
            ) from None
        check_launch(backend)
        spec = _job_spec(args, recipe_args, backend, run_dir)
        output_dir = Path(spec.output_dir)
        script = batch_script(spec)
        check_layout(spec.recipe, recipe_args, spec, plans=plans)
    except SubmitError as error:
        print(f"baton submit: {error}", file=sys.stderr)
        return 2
    shared = (
        f"baton submit: every node reads and writes {spec.workdir} and {run_dir} (a shared "
        "filesystem, as on most SLURM clusters): check that all nodes see them"
    )
    output_dir.mkdir(parents=True, exist_ok=True)  # SLURM opens --output before the script
    if args.dry_run:
        print(script, end="")
        if args.nodes > 1:
            print(shared, file=sys.stderr)
        return 0
    if args.nodes > 1:
        print(shared, file=sys.stderr)
    assert sbatch is not None
    return _submit(sbatch, script, output_dir / f"{spec.job_name}.sbatch", output_dir)
