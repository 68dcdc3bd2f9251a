"""Which backends ``baton compare`` runs and how: the compared backends (each one's
descriptor's ``CompareRun``), the objectives they may be compared on, the command line
each backend's recipe is run with (the shared settings, the objective's settings, the
recipe's own flags), and running those commands, each in its own process.

Example::

    from pathlib import Path
    from baton.tools.compare_backends import backend_command, compared, setting_flags

    list(compared())            # ['fabric', 'torchtitan', 'megatron', 'maxtext']
    flags = setting_flags("grpo", {"num_generations": 4})   # ['--num-generations=4']
    backend_command("megatron", Path("runs/compare_backends"), init_from="model",
                    data_path="data/reference", tokenizer="data/tokenizer", steps=50,
                    seq_len=128, batch=4, lr=1e-3, objective_flags=flags)
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from baton.core.backend_descriptor import CompareRun, backend_descriptors
from baton.core.objectives import OBJECTIVES, ObjectiveRun, objective_named
from baton.core.objectives.registry import SHIPPED

#: where the backends' tiny recipes are found unless ``--recipes`` says otherwise
RECIPES = Path("recipes")


def compared() -> dict[str, CompareRun]:
    """The backends ``baton compare`` runs, each with how (its descriptor's
    ``CompareRun``), in the order backends are listed: the first is the reference."""
    return {d.name: d.compare for d in backend_descriptors() if d.compare is not None}


def compared_objectives() -> tuple[str, ...]:
    """What ``--objective`` may ask for: each registered objective that a compared backend
    declares, the shipped ones first (``pretrain``, ``sft``, ``dpo``, ``grpo``), then by
    name."""
    declared = {o for d in backend_descriptors() if d.compare is not None for o in d.objectives}
    shipped = [o.name for o in SHIPPED]
    ordered = [*shipped, *(n for n in OBJECTIVES.names() if n not in shipped)]
    return tuple(name for name in ordered if name in declared)


def setting_flags(objective: str, values: Mapping[str, Any]) -> list[str]:
    """The recipe flags of the given settings of ``objective`` (``--num-generations=4``,
    ``--reward=A --reward=B``, ``--reward-weights 1 0.5``, ``--no-FLAG``), after checking
    them with the objective's own checks (``UsageError``: one not its own, a bad value,
    or a combination it refuses)."""
    ObjectiveRun.of(objective, **values)
    declared = {s.name: s for s in objective_named(objective).settings}
    flags: list[str] = []
    for name, value in values.items():
        setting = declared[name]
        if setting.type is bool and not (setting.repeatable or setting.listed):
            flags.append(setting.flag if value else "--no-" + setting.flag[2:])
        elif setting.repeatable:
            flags += [f"{setting.flag}={item}" for item in value]
        elif setting.listed:
            flags += [setting.flag, *(str(item) for item in value)]
        else:
            flags.append(f"{setting.flag}={value}")
    return flags


def takes_objective(recipe: Path) -> bool:
    """Whether the recipe at ``recipe`` has an ``objective`` flag (post-training)."""
    from baton.core.cli.recipe_signature import read_signature

    signature = read_signature(recipe)
    return signature is not None and any(p.name == "objective" for p in signature.params)


def objective_backends(objective: str, recipes: Path) -> tuple[str, ...]:
    """The compared backends that declare ``objective`` and, past pretraining, whose recipe
    in ``recipes`` takes ``--objective``, in order."""
    declared = {d.name for d in backend_descriptors() if objective in d.objectives}

    def recipe_runs_it(run: CompareRun) -> bool:
        recipe = recipes / run.recipe
        return objective == "pretrain" or (recipe.is_file() and takes_objective(recipe))

    return tuple(b for b, run in compared().items() if b in declared and recipe_runs_it(run))


def backend_command(
    backend: str,
    run_dir: Path,
    *,
    init_from: str,
    data_path: str,
    tokenizer: str,
    steps: int,
    seq_len: int,
    batch: int,
    lr: float,
    warmup_steps: int = 0,
    min_lr: float | None = None,
    recipes: Path = RECIPES,
    objective: str = "pretrain",
    lr_schedule: str = "cosine",
    objective_flags: Sequence[str] = (),
) -> list[str]:
    """``python -m baton.core.cli.command run <backend's recipe> --init-from ...`` with the shared
    settings: the same schedule flags on every recipe (``min_lr`` None: ``lr / 10``;
    ``--objective sft``: on packed rows of ``seq_len`` inputs), the objective's settings
    (``objective_flags``: ``setting_flags``), then the recipe's own flags (its
    descriptor's ``CompareRun``)."""
    common = [
        f"--init-from={init_from}",
        f"--max-steps={steps}",
        f"--lr={lr}",
        f"--lr-schedule={lr_schedule}",
        f"--warmup-steps={min(warmup_steps, steps)}",
        f"--min-lr={lr / 10 if min_lr is None else min_lr}",
        f"--data-path={data_path}",
        f"--tokenizer={tokenizer}",
        f"--run-dir={run_dir / backend}",
        "--log-every=1",
        "--save-every=0",
        "--overwrite",
    ]
    if objective != "pretrain":
        common.append(f"--objective={objective}")
    common += objective_flags
    run = compared()[backend]
    own = run.command_flags(seq_len=seq_len, batch=batch, steps=steps)
    recipe = recipes / run.recipe
    return [sys.executable, "-m", "baton.core.cli.command", "run", str(recipe), *common, *own]


def run_backends(
    backends: Sequence[str], root: Path, settings: dict[str, Any]
) -> tuple[dict[str, float], list[str]]:
    """Each backend's recipe in its own process (output in ``root/<backend>.log``); the
    wall time of each and the failures."""
    wall: dict[str, float] = {}
    failed: list[str] = []
    for backend in backends:
        command = backend_command(backend, root, **settings)
        log = root / f"{backend}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"{backend}: running (output in {log})", flush=True)
        start = time.perf_counter()
        with log.open("w", encoding="utf-8") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
        wall[backend] = time.perf_counter() - start
        if code != 0:
            failed.append(f"{backend} (exit {code}, see {log})")
        print(f"{backend}: exit {code} after {wall[backend]:.0f} s", flush=True)
    return wall, failed
