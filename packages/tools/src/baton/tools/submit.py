"""``baton submit RECIPE [recipe flags] --nodes N --gpus-per-node G --time HH:MM:SS``:
run a recipe as a SLURM batch job that saves before its time limit and requeues itself.

Example::

    baton submit recipes/torchtitan_llama3_8b.py --nodes 4 --gpus-per-node 8 \\
        --time 04:00:00 --partition gpu --run-dir runs/llama3_8b
    baton submit recipes/maxtext_tiny.py --nodes 2 --time 00:30:00 --dry-run   # print it

The job is an ``sbatch`` script (``--dry-run`` prints it and submits nothing):

- torch backends (fabric, torchtitan, megatron): one ``srun`` task per node, each
  running ``torchrun`` with a c10d rendezvous on the job's first node, one worker per
  GPU (``--procs-per-node`` on CPU);
- JAX backends (maxtext, jax): one ``srun`` task per process (``--procs-per-node``,
  default 1 per host); each reads its rank from SLURM and joins ``jax.distributed``
  with the first node as coordinator.

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
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: backends whose processes rendezvous through torch.distributed (torchrun per node)
TORCH_BACKENDS = frozenset({"fabric", "torchtitan", "megatron"})
#: backends whose processes rendezvous through jax.distributed (one task per process)
JAX_BACKENDS = frozenset({"maxtext", "jax"})
RDZV_PORT = 29400
#: CPU cores asked per worker (torchrun worker or JAX process) a task runs, by default
CPUS_PER_WORKER = 8
#: memory asked per worker on a node, by default (SLURM size syntax, in gigabytes)
MEM_PER_WORKER_GB = 32
#: a recipe's parameters that set the world size its ``--dry-run`` plans for
WORLD_SIZE_PARAMETERS = ("gpus", "world_size", "devices")
#: variables the task's shell expands (each task has its own node id)
_TASK_VARIABLES = frozenset(
    {"$SLURM_NNODES", "$SLURM_NODEID", "$SLURM_JOB_ID", f"$BATON_HEAD_NODE:{RDZV_PORT}"}
)
_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$")


class SubmitError(ValueError):
    """A bad ``baton submit`` invocation; the message says what to change."""


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
        return self.backend not in JAX_BACKENDS

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
    baton = [spec.python, "-m", "baton.core.cli", "run", spec.recipe, *spec.recipe_args]
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


def _gpu_flags(recipe: str, recipe_args: list[str], gpus_per_node: int) -> list[str]:
    """The recipe's flags for a GPU job: ``--accelerator cuda`` added where the recipe
    has that parameter and the flags do not name one; a CPU accelerator is refused."""
    from baton.core.recipe_signature import read_signature

    if not gpus_per_node:
        return recipe_args
    given = [a for a in recipe_args if a == "--accelerator" or a.startswith("--accelerator=")]
    if given:
        at = recipe_args.index(given[0])
        value = given[0].partition("=")[2] or (recipe_args[at + 1 : at + 2] or [""])[0]
        if value == "cpu":
            raise SubmitError(
                f"--gpus-per-node {gpus_per_node} with --accelerator cpu: the job would hold "
                "GPUs and train on the CPU; pass --accelerator cuda (or auto), or drop "
                "--gpus-per-node for a CPU job"
            )
        return recipe_args
    signature = read_signature(Path(recipe))
    if signature is not None and any(p.name == "accelerator" for p in signature.params):
        return [*recipe_args, "--accelerator", "cuda"]
    return recipe_args


def _check_recipe(
    recipe: str, recipe_args: list[str], gpus_per_node: int = 0
) -> tuple[str, str, bool]:
    """Build the recipe's driver as ``baton run`` would (nothing trains): returns the
    backend name, the run directory and whether the backend plans a layout (the
    ``dry_run`` ability), or raises with the recipe's own message."""
    from baton.core.backend import DryRuns
    from baton.core.errors import UsageError
    from baton.core.quiet import quiet_imports
    from baton.core.recipe import build_driver

    quiet_imports()  # as ``baton run``: the recipe imports its framework next
    try:
        driver = build_driver(recipe, recipe_args)
    except SystemExit as exit_:  # tyro printed why the flags are wrong
        raise SubmitError(f"the recipe's flags were rejected (exit {exit_.code})") from None
    except UsageError as error:  # a RecipeError too
        raise SubmitError(str(error)) from None
    if driver is None:
        raise SubmitError(
            f"{recipe} built no Driver (its flags asked to print only): nothing to submit"
        )
    fixed = cpu_setting(driver.backend.config)
    if gpus_per_node and fixed is not None:
        raise SubmitError(
            f"--gpus-per-node {gpus_per_node}, but {recipe} configures its backend with "
            f"{fixed}: the job would train on the CPU; give the recipe an accelerator or "
            "hardware parameter (or set it to a GPU), or drop --gpus-per-node"
        )
    return driver.backend.name, str(driver.options.run_dir), isinstance(driver.backend, DryRuns)


def cpu_setting(config: Any) -> str | None:
    """The backend setting that fixes a run to the CPU, as the recipe wrote it
    (``FabricConfig(accelerator="cpu")``, MaxText's ``hardware=cpu``), or ``None``."""
    if getattr(config, "accelerator", None) == "cpu":
        return "accelerator='cpu'"
    get = getattr(config, "get", None)  # MaxText's settings
    if callable(get) and get("hardware") == "cpu":
        return "hardware=cpu"
    return None


def check_layout(
    recipe: str, recipe_args: Sequence[str], spec: JobSpec, *, plans: bool = False
) -> None:
    """Ask a recipe whose backend plans its parallel layout (``plans``: the ``dry_run``
    ability, ``baton run --dry-run --world-size N``; or a recipe of its own ``dry_run``
    parameter with one of ``WORLD_SIZE_PARAMETERS``) to plan it for the job's world size,
    in a process of its own (a simulated device count must be set before JAX starts); a
    refusal is a ``SubmitError`` in the recipe's words. Other recipes check their layout
    at start."""
    from baton.core.recipe_signature import read_signature

    signature = read_signature(Path(recipe))
    names = {p.name for p in signature.params} if signature is not None else set()
    world = next((n for n in WORLD_SIZE_PARAMETERS if n in names), None)
    if "dry_run" in names and world is not None:
        flag = "--" + world.replace("_", "-")
    elif plans:
        flag = "--world-size"
    else:
        return
    command = [spec.python, "-m", "baton.core.cli", "run", recipe, *recipe_args,
               "--dry-run", flag, str(spec.world_size)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    ours = [line for line in said if line.startswith("baton:")]
    why = (ours or said or [f"exit {done.returncode}"])[-1].removeprefix("baton: ")
    raise SubmitError(
        f"{recipe} refuses the job's layout for {spec.world_size} ranks ({spec.nodes} nodes "
        f"x {spec.workers_per_node}; its own --dry-run {flag} {spec.world_size}): {why}"
    )


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
        recipe_args = _gpu_flags(args.recipe, recipe_args, args.gpus_per_node)
        sbatch = shutil.which("sbatch")
        if sbatch is None and not args.dry_run:
            raise SubmitError(
                "sbatch is not on PATH: no SLURM client here. Run on a SLURM login node, "
                "or use --dry-run to print the script"
            )
        try:
            backend, run_dir, plans = _check_recipe(args.recipe, recipe_args, args.gpus_per_node)
        except SubmitError as error:
            if not args.dry_run:
                raise
            raise SubmitError(
                f"{error} (the recipe is checked as the job will run it, training: baton "
                "submit's --dry-run only prints the script)"
            ) from None
        if backend not in TORCH_BACKENDS | JAX_BACKENDS:
            raise SubmitError(f"backend {backend!r} has no SLURM launch; known: fabric, "
                              "torchtitan, megatron (torchrun), maxtext, jax (jax.distributed)")  # fmt: skip
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
