"""The checks ``baton submit`` makes of a recipe before anything is queued: its flags
for a GPU job, its driver built as ``baton run`` would (nothing trains), and its
parallel layout planned for the job's world size.

Example::

    from baton.tools.submit_checks import check_layout, check_recipe, gpu_flags

    args = gpu_flags("recipes/quickstart.py", [], gpus_per_node=8)  # + --accelerator cuda
    backend, run_dir, plans = check_recipe("recipes/quickstart.py", args, 8)
    check_layout("recipes/quickstart.py", args, spec, plans=plans)  # SubmitError if refused
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baton.tools.slurm_script import JobSpec, SubmitError

#: a recipe's parameters that set the world size its ``--dry-run`` plans for
WORLD_SIZE_PARAMETERS = ("gpus", "world_size", "devices")


def gpu_flags(recipe: str, recipe_args: list[str], gpus_per_node: int) -> list[str]:
    """The recipe's flags for a GPU job: ``--accelerator cuda`` added where the recipe
    has that parameter and the flags do not name one; a CPU accelerator is refused."""
    from baton.core.cli.recipe_signature import read_signature

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


def check_recipe(
    recipe: str, recipe_args: list[str], gpus_per_node: int = 0
) -> tuple[str, str, bool]:
    """Build the recipe's driver as ``baton run`` would (nothing trains): returns the
    backend name, the run directory and whether the backend plans a layout (the
    ``dry_run`` ability), or raises with the recipe's own message."""
    from baton.core.backend import offers
    from baton.core.cli.recipe import build_driver
    from baton.core.errors import UsageError
    from baton.core.quiet import quiet_imports

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
    return driver.backend.name, str(driver.options.run_dir), offers(driver.backend, "dry_run")


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
    from baton.core.cli.recipe_signature import read_signature

    signature = read_signature(Path(recipe))
    names = {p.name for p in signature.params} if signature is not None else set()
    world = next((n for n in WORLD_SIZE_PARAMETERS if n in names), None)
    if "dry_run" in names and world is not None:
        flag = "--" + world.replace("_", "-")
    elif plans:
        flag = "--world-size"
    else:
        return
    command = [spec.python, "-m", "baton.core.cli.command", "run", recipe, *recipe_args,
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
