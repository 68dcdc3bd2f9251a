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
backend configured for the CPU (``FabricConfig(accelerator="cpu")``) is refused.
``--cpus-per-task`` and ``--mem`` ask SLURM for CPU cores and memory per task.

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

#: backends whose processes rendezvous through torch.distributed (torchrun per node)
TORCH_BACKENDS = frozenset({"fabric", "torchtitan", "megatron"})
#: backends whose processes rendezvous through jax.distributed (one task per process)
JAX_BACKENDS = frozenset({"maxtext", "jax"})
RDZV_PORT = 29400
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
    tasks_per_node = 1 if spec.uses_torchrun else spec.procs_per_node
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
    if spec.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={spec.cpus_per_task}")
    if spec.mem:
        lines.append(f"#SBATCH --mem={spec.mem}")
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    if spec.account:
        lines.append(f"#SBATCH --account={spec.account}")
    lines += [f"#SBATCH {arg}" for arg in spec.extra_sbatch]
    baton = [spec.python, "-m", "baton.core.cli", "run", spec.recipe, *spec.recipe_args]
    baton += ["--resume", "auto"]
    if spec.uses_torchrun:
        per_node = spec.gpus_per_node or spec.procs_per_node
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
        "srun --kill-on-bad-exit=1 bash -c " + shlex.quote(f'trap "" USR1; exec {command}'),
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
        help="CPU cores per task (a torchrun task per node serves all its GPU workers)",
    )
    parser.add_argument("--mem", help="memory per node, SLURM syntax (e.g. 480G, 0 for all)")
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
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
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


def _check_recipe(recipe: str, recipe_args: list[str], gpus_per_node: int = 0) -> tuple[str, str]:
    """Build the recipe's driver as ``baton run`` would (nothing trains): returns the
    backend name and run directory, or raises with the recipe's own message."""
    from baton.core.quiet import quiet_imports
    from baton.core.recipe import RecipeError, build_driver

    quiet_imports()  # as ``baton run``: the recipe imports its framework next
    try:
        driver = build_driver(recipe, recipe_args)
    except SystemExit as exit_:  # tyro printed why the flags are wrong
        raise SubmitError(f"the recipe's flags were rejected (exit {exit_.code})") from None
    except RecipeError as error:
        raise SubmitError(str(error)) from None
    if driver is None:
        raise SubmitError(f"{recipe} built no Driver (a --dry-run recipe?): nothing to submit")
    accelerator = getattr(driver.backend.config, "accelerator", None)
    if gpus_per_node and accelerator == "cpu":
        raise SubmitError(
            f"--gpus-per-node {gpus_per_node}, but {recipe} configures its backend with "
            "accelerator='cpu': the job would train on the CPU; give the recipe an "
            "accelerator parameter (or set it to 'cuda'/'auto'), or drop --gpus-per-node"
        )
    return driver.backend.name, str(driver.options.run_dir)


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
        backend, run_dir = _check_recipe(args.recipe, recipe_args, args.gpus_per_node)
        if backend not in TORCH_BACKENDS | JAX_BACKENDS:
            raise SubmitError(f"backend {backend!r} has no SLURM launch; known: fabric, "
                              "torchtitan, megatron (torchrun), maxtext, jax (jax.distributed)")  # fmt: skip
        output_dir = Path(run_dir).absolute() / "slurm"
        spec = JobSpec(
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
            output_dir=str(output_dir),
            workdir=str(Path.cwd()),
            extra_sbatch=tuple(args.sbatch_arg),
        )
        script = batch_script(spec)
    except SubmitError as error:
        print(f"baton submit: {error}", file=sys.stderr)
        return 2
    shared = (
        f"baton submit: every node reads and writes {spec.workdir} and {run_dir} (a shared "
        "filesystem, as on most SLURM clusters): check that all nodes see them"
    )
    if args.dry_run:
        print(script, end="")
        if args.nodes > 1:
            print(shared, file=sys.stderr)
        return 0
    if args.nodes > 1:
        print(shared, file=sys.stderr)
    assert sbatch is not None
    return _submit(sbatch, script, output_dir / f"{spec.job_name}.sbatch", output_dir)
